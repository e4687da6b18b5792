"""A text classifier in pure Python: hashed bag of words, naive Bayes weights.

Standard library only (re, zlib, math, array), so it imports in an isolated PEP 684
subinterpreter as well as in a private interpreter. Each text is lower-cased and
split into words; every word and every pair of adjacent words is hashed into one of
`BUCKETS` features with zlib.crc32 (stable across interpreters and processes, unlike
the salted built-in hash()); class scores are a linear function of the feature
counts. The weights are trained at load time on the labelled sentences in
`corpus.tsv` beside this file (multinomial naive Bayes, add-one smoothing), so every
interpreter builds the same table.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from array import array
from collections.abc import Iterable
from itertools import pairwise
from typing import Any

from aserve.runtime import Model, TensorSpec

BUCKETS = 1 << 12
CLASSES = ("sports", "tech", "food")
_WORD = re.compile(r"[a-z0-9']+")


def tokens(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def features(text: str) -> list[int]:
    """Bucket indices of the words and word pairs of `text` (repeats kept)."""
    words = tokens(text)
    grams = words + [a + " " + b for a, b in pairwise(words)]
    return [zlib.crc32(g.encode()) & (BUCKETS - 1) for g in grams]


def read_corpus(path: str) -> list[tuple[str, str]]:
    """(label, sentence) pairs from a tab-separated file; '#' lines are comments."""
    pairs = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            label, _, sentence = line.partition("\t")
            pairs.append((label, sentence))
    return pairs


def train(pairs: Iterable[tuple[str, str]], classes: tuple[str, ...] = CLASSES) -> tuple[list[float], array]:
    """Naive Bayes: (log prior per class, log likelihood table [bucket * K + class])."""
    k = len(classes)
    index = {c: i for i, c in enumerate(classes)}
    docs = [0] * k
    counts = [[0] * BUCKETS for _ in range(k)]
    for label, sentence in pairs:
        c = index[label]
        docs[c] += 1
        row = counts[c]
        for f in features(sentence):
            row[f] += 1
    total_docs = sum(docs)
    prior = [math.log(d / total_docs) for d in docs]
    table = array("d", bytes(8 * BUCKETS * k))
    for c in range(k):
        row = counts[c]
        denom = math.log(sum(row) + BUCKETS)
        for f in range(BUCKETS):
            table[f * k + c] = math.log(row[f] + 1) - denom
    return prior, table


def softmax(scores: list[float]) -> list[float]:
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


class TextClassifier(Model):
    inputs = (TensorSpec("TEXT", "BYTES", (-1,)),)
    outputs = (TensorSpec("LABEL", "BYTES", (-1,)), TensorSpec("SCORES", "FP32", (-1, len(CLASSES))))
    tensor_format = "memoryview"

    def load(self) -> None:
        corpus = os.path.join(self.directory, str(self.parameters.get("corpus", "corpus.tsv")))
        self.prior, self.table = train(read_corpus(corpus))

    def classify(self, text: str) -> list[float]:
        """Class probabilities for one text."""
        k = len(CLASSES)
        table = self.table
        scores = list(self.prior)
        for f in features(text):
            base = f * k
            for c in range(k):
                scores[c] += table[base + c]
        return softmax(scores)

    def __call__(self, inputs: dict[str, Any]) -> dict[str, Any]:
        labels: list[str] = []
        scores = array("f")
        for item in inputs["TEXT"]:
            probs = self.classify(bytes(item).decode("utf-8", errors="replace"))
            labels.append(CLASSES[probs.index(max(probs))])
            scores.extend(probs)
        return {"LABEL": labels, "SCORES": memoryview(scores)}
