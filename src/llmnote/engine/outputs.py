"""What a request gives back: streamed text deltas and the final :class:`RequestOutput`.

**Text as it is generated.** A byte-level BPE token can hold part of a multi-byte UTF-8
character; decoding the tokens so far then ends in U+FFFD, the replacement character. The
detokenizer holds such a tail back until the character is complete, so no delta ever splits
a character. **Stop strings** are searched in the text, since one can span several tokens;
the text is cut where the first one begins, and text that might be the start of a stop string
is held back until it is clear that it is not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["Detokenizer", "RequestOutput"]


@dataclass
class RequestOutput:
    """One request's result (or, while streaming, its state so far)."""

    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]  # generated
    text: str
    finish_reason: str | None  # "stop" | "length" | "abort"; None while running
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache
    metrics: dict = field(default_factory=dict)  # timestamps and preemptions, once finished

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


class Detokenizer:
    """Turns one request's growing token list into text deltas, and finds its stop strings.

    Decoding all tokens at every step would cost time quadratic in the output's length, so
    each step decodes only a short window: the last few tokens already turned into text
    (context, so that tokenizers which treat a leading space specially decode them as they
    would inside the text) and the new ones; the new text is the window's text past the
    context's."""

    CONTEXT = 4  # tokens of context before the new ones

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer, self.stop = tokenizer, stop
        self.decoded = ""  # the text of the tokens read so far
        self.text = ""  # what has been released: a prefix of ``decoded``
        self.stopped = False
        self._read = 0  # tokens turned into text so far
        self._hold = max((len(s) for s in stop), default=1) - 1  # a stop string's possible start

    def _read_new(self, token_ids: list[int]) -> None:
        start = max(0, self._read - self.CONTEXT)
        before = self.tokenizer.decode(token_ids[start : self._read])
        window = self.tokenizer.decode(token_ids[start:])
        if window.endswith("\ufffd") or not window.startswith(before):
            return  # an unfinished character: wait for the token that completes it
        self.decoded += window[len(before) :]
        self._read = len(token_ids)

    def update(self, token_ids: list[int], final: bool = False) -> str:
        """The new text after the output grew to ``token_ids`` (all generated tokens so far);
        ``final`` releases everything held back. Sets :attr:`stopped` at a stop string."""
        if self.stopped:
            return ""
        self._read_new(token_ids)
        if final and self._read < len(token_ids):  # the output ended inside a character
            self.decoded += self.tokenizer.decode(token_ids[self._read :])
            self._read = len(token_ids)
        full = self.decoded
        for s in self.stop:
            at = full.find(s, max(0, len(self.text) - len(s) + 1))
            if at != -1:
                full, self.stopped, final = full[:at], True, True
        if not final and self.stop:
            full = full[: max(len(self.text), len(full) - self._hold)]
        delta, self.text = full[len(self.text) :], full
        return delta
