"""Cleaning, deduplication and the split of Keel's English corpus (scripts/prepare-corpus;
docs/corpus.md); the converters that make its paragraphs are in corpus_convert.py.

Two parts, tested in corpus_text_test.py:
- Cleaning (clean_paragraph, is_english): whitespace normalised, paragraphs that are mostly
  code, symbols or numbers dropped, documents that are not English dropped.
- Corpus assembly (Corpus): exact-duplicate documents and repeated paragraphs across the whole
  corpus dropped (the first occurrence is kept), and the deterministic train/validation split by
  document (split_of).

Python 3 standard library only (Debian's python3).
"""
import hashlib
import re
import unicodedata

# ----------------------------------------------------------------------------------------------
# Cleaning.

# Paragraphs shorter than this (after normalisation) are headings, labels and list items: they
# are kept up to MAX_SHORT_COPIES times in the corpus ("Parameters:", "See also"); longer ones
# are kept once.
MIN_DEDUP_CHARS = 40
# API references repeat their labels ("Parameters:", "Returns:") tens of thousands of times, and
# some generators leave navigation text on every page: past this many copies a short paragraph
# is boilerplate.
MAX_SHORT_COPIES = 20
# A paragraph's letters (a-z, A-Z) over its non-space characters must reach this: English prose
# sits near 0.8, code and tables of symbols or numbers well under 0.7.
MIN_LETTER_SHARE = 0.7
# At most this share of a paragraph's non-space characters may be outside ASCII: translations and
# binary junk fail it, English with a few quotes, dashes and names passes.
MAX_NON_ASCII_SHARE = 0.05
# At most this share of a paragraph's non-space characters may be code punctuation
# ({}[];=<>$@#\|&^~`*): prose uses them rarely, code on most lines.
MAX_CODE_SYMBOL_SHARE = 0.06
_CODE_SYMBOLS = frozenset("{}[];=<>$@#\\|&^~`*")
# Words longer than this are hashes, URLs, base64 or identifiers run together.
MAX_WORD_CHARS = 40
# A document is English when at least this share of its words are common English function words
# (the, of, and, ...); English prose is near 0.4, technical English near 0.25, German or French
# near 0.02. Only documents with at least MIN_LANGUAGE_WORDS words are judged; shorter ones pass.
MIN_ENGLISH_SHARE = 0.12
MIN_LANGUAGE_WORDS = 30
# A kept document has at least this many letters after cleaning.
MIN_DOCUMENT_LETTERS = 200

_ENGLISH_WORDS = frozenset("""
the of and to a in is that for it as with be on this by are or not an from at which can if
you your we our they their there these those when will would should may must have has had
was were been but all any each other than then so such into also only more most no one two
use used using see how what where who whose its do does only new same about between after
before over under while because both either through this that every some many much
""".split())

_WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)?")
_SPACE = re.compile(r"\s+")
_SECTION_NUMBER = re.compile(r"^(?:\d+\.)*\d+\.? ")


def normalize_space(text):
    """NFC, every run of whitespace (newlines included) one space, no space at either end."""
    return _SPACE.sub(" ", unicodedata.normalize("NFC", text)).strip()


def clean_paragraph(text):
    """The paragraph normalised, or None when it is not prose worth training on.

    Dropped: empty paragraphs, control characters other than whitespace, a letter share under
    MIN_LETTER_SHARE, a share of code punctuation over MAX_CODE_SYMBOL_SHARE, a non-ASCII share
    over MAX_NON_ASCII_SHARE, and paragraphs where a quarter or more of the words are longer
    than MAX_WORD_CHARS.
    """
    p = normalize_space(text)
    if not p:
        return None
    if any(unicodedata.category(c) == "Cc" for c in p):
        return None
    body = _SECTION_NUMBER.sub("", p)  # "9.3.2. Class Objects" is a heading, not numbers
    solid = len(body) - body.count(" ")
    letters = sum(1 for c in body if ("a" <= c <= "z") or ("A" <= c <= "Z"))
    if letters < MIN_LETTER_SHARE * solid:
        return None
    if sum(1 for c in body if c in _CODE_SYMBOLS) > MAX_CODE_SYMBOL_SHARE * solid:
        return None
    non_ascii = sum(1 for c in p if ord(c) > 127)
    if non_ascii > MAX_NON_ASCII_SHARE * solid:
        return None
    words = p.split(" ")
    long_words = sum(1 for w in words if len(w) > MAX_WORD_CHARS)
    if long_words and long_words * 4 >= len(words):
        return None
    return p


def english_share(paragraphs):
    """(function words, words) over the paragraphs: the numbers behind is_english."""
    hits = total = 0
    for p in paragraphs:
        for w in _WORD.findall(p):
            total += 1
            if w.lower() in _ENGLISH_WORDS:
                hits += 1
    return hits, total


def is_english(paragraphs):
    """True when the paragraphs read as English (MIN_ENGLISH_SHARE), or are too short to judge."""
    hits, total = english_share(paragraphs)
    return total < MIN_LANGUAGE_WORDS or hits >= MIN_ENGLISH_SHARE * total


def _letters(paragraphs):
    return sum(sum(1 for c in p if c.isalpha()) for p in paragraphs)


# ----------------------------------------------------------------------------------------------
# The split and the corpus.

VAL_PER_MILLE = 10  # documents whose key hashes to 0..9 of 0..999 go to validation (1%)


def split_of(key):
    """'val' or 'train' for a document key ("package/path"): a pure function of the key (the
    first 8 bytes of its SHA-256 mod 1000 below VAL_PER_MILLE), so the split is the same on
    every machine and every rebuild, whatever else the corpus holds."""
    h = int.from_bytes(hashlib.sha256(key.encode("utf-8")).digest()[:8], "big")
    return "val" if h % 1000 < VAL_PER_MILLE else "train"


def _digest(text):
    return hashlib.blake2b(text.encode("utf-8"), digest_size=12).digest()


class Corpus:
    """Cleans, deduplicates and splits documents offered in a fixed order.

    add() takes a document (a key and its paragraphs) and returns (split, text) or None. Per
    document: every paragraph is cleaned (clean_paragraph); a document that is not English
    (is_english, on the cleaned paragraphs) is dropped; a document whose cleaned text was seen
    before is dropped (exact duplicate); paragraphs of MIN_DEDUP_CHARS or more seen before in
    any document are dropped (the first occurrence is kept, wherever it went), shorter ones
    past their MAX_SHORT_COPIES-th copy too; a document left with fewer than
    MIN_DOCUMENT_LETTERS letters is dropped. The text returned is the kept
    paragraphs, one a line, with a blank line between paragraphs and a newline at the end.

    The result depends only on the documents and their order: the same input gives the same
    output, byte for byte. No paragraph of MIN_DEDUP_CHARS or more is in both splits.
    """

    def __init__(self):
        self._seen_documents = set()
        self._seen_paragraphs = set()
        self._short_copies = {}
        self.stats = {
            "documents_in": 0, "documents_not_english": 0, "documents_duplicate": 0,
            "documents_too_short": 0, "documents_kept": 0,
            "paragraphs_in": 0, "paragraphs_not_prose": 0, "paragraphs_duplicate": 0,
            "paragraphs_short_repeated": 0, "paragraphs_kept": 0,
        }

    def add(self, key, paragraphs):
        st = self.stats
        st["documents_in"] += 1
        st["paragraphs_in"] += len(paragraphs)
        cleaned = []
        for p in paragraphs:
            c = clean_paragraph(p)
            if c is None:
                st["paragraphs_not_prose"] += 1
            else:
                cleaned.append(c)
        if not is_english(cleaned):
            st["documents_not_english"] += 1
            return None
        doc_digest = _digest("\n".join(cleaned))
        if doc_digest in self._seen_documents:
            st["documents_duplicate"] += 1
            return None
        self._seen_documents.add(doc_digest)
        kept = []
        for c in cleaned:
            if len(c) >= MIN_DEDUP_CHARS:
                d = _digest(c)
                if d in self._seen_paragraphs:
                    st["paragraphs_duplicate"] += 1
                    continue
                self._seen_paragraphs.add(d)
            else:
                n = self._short_copies.get(c, 0) + 1
                self._short_copies[c] = n
                if n > MAX_SHORT_COPIES:
                    st["paragraphs_short_repeated"] += 1
                    continue
            kept.append(c)
        if _letters(kept) < MIN_DOCUMENT_LETTERS:
            st["documents_too_short"] += 1
            return None
        st["documents_kept"] += 1
        st["paragraphs_kept"] += len(kept)
        return split_of(key), "\n\n".join(kept) + "\n"
