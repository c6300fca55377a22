"""Tests of corpus_convert.py and corpus_text.py: the converters, the cleaning, the deduplication and the split of
Keel's English corpus, on small fixtures (no network, no packages)."""
import gzip
import unittest

import corpus_convert as cc
import corpus_text as ct

PROSE = ("The scheduler assigns every run to a worker that has a free slot, and it keeps the "
         "assignment in the store so that a restarted coordinator finds it again.")
GPL = ("This program is free software; you can redistribute it and/or modify it under the terms "
       "of the GNU General Public License as published by the Free Software Foundation.")
GERMAN = ("Der Planer weist jeden Lauf einem Arbeiter mit einem freien Platz zu und speichert die "
          "Zuweisung, damit ein neu gestarteter Koordinator sie wiederfindet.")


def sentence(i):
    """A distinct English paragraph per i."""
    return ("Paragraph %s explains how the worker %s reads its configuration, which settings "
            "it accepts and what happens when one of them is missing." % (words(i), words(i + 7)))


def words(i):
    names = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel"]
    out = []
    while True:
        out.append(names[i % 8])
        i //= 8
        if i == 0:
            return " ".join(out)


class HtmlTest(unittest.TestCase):
    def test_keeps_prose_and_drops_furniture_and_code(self):
        page = """<html><head><title>T</title><script>var x = 1;</script></head><body>
          <nav><a href="a.html">Home</a> <a href="b.html">Next</a></nav>
          <div class="sphinxsidebar"><p>Sidebar text that is not content.</p></div>
          <h1>Classes</h1>
          <p>Classes provide a means of <em>bundling</em> data
             and functionality together.</p>
          <pre>class Foo:\n    pass</pre>
          <div class="highlight"><span>x = 1</span></div>
          <ul><li><a href="#one">9.1. A Word About Names</a></li></ul>
          <p>Objects have individuality &amp; multiple names.<br>A second line.</p>
          <footer>Copyright 2023</footer></body></html>"""
        self.assertEqual(cc.html_paragraphs(page), [
            "Classes",
            "Classes provide a means of bundling data and functionality together.",
            "Objects have individuality & multiple names.",
            "A second line."])

    def test_mallard_page(self):
        page = """<page xmlns="http://projectmallard.org/1.0/"><info><credit>Someone</credit>
          </info><title>Search for files</title><p>You can search for files.</p>
          <screen>find / -name x</screen><steps><item><p>Open Files.</p></item></steps></page>"""
        self.assertEqual(cc.html_paragraphs(page),
                         ["Search for files", "You can search for files.", "Open Files."])


class PlainTest(unittest.TestCase):
    def test_rst_literal_blocks_directives_and_roles(self):
        text = """Title
=====

Use :func:`open` to read a file, see ``mode`` and `the guide <http://x>`_::

    with open(p) as f:
        data = f.read()

.. note::

   A directive body.

The end of the
paragraph is joined.
"""
        self.assertEqual(cc.plain_paragraphs(text), [
            "Title",
            "Use open to read a file, see mode and the guide:",
            "The end of the paragraph is joined."])

    def test_markdown_fences_and_lists(self):
        text = "Intro with a [link](http://x).\n\n```\ncode here\n\nmore code\n```\n\n- one\n- two\n"
        self.assertEqual(cc.plain_paragraphs(text), ["Intro with a link.", "- one", "- two"])

    def test_rendered_man_page(self):
        text = ("PIPE(7)        Linux Programmer's Manual        PIPE(7)\n\nNAME\n"
                "       pipe - overview of pipes and FIFOs\n\nDESCRIPTION\n"
                "       Pipes and FIFOs provide a unidirectional in\u2010\n"
                "       terprocess channel.\n\nLinux 2023-02-05        PIPE(7)\n")
        self.assertEqual(cc.rendered_man_paragraphs(text), [
            "NAME", "pipe - overview of pipes and FIFOs", "DESCRIPTION",
            "Pipes and FIFOs provide a unidirectional interprocess channel."])

    def test_pod(self):
        text = ("=head1 NAME\n\nperlsyn - Perl syntax\n\n=head2 Declarations\n\n"
                "You need to declare B<formats> and C<sub>s, see L<perlsub/Foo>.\n\n"
                "    my $x = 1;\n\n=cut\n\nsub code { }\n")
        self.assertEqual(cc.pod_paragraphs(text), [
            "NAME", "perlsyn - Perl syntax", "Declarations",
            "You need to declare formats and subs, see perlsub."])

    def test_info(self):
        text = ("\x1f\nFile: a.info,  Node: Top,  Next: Intro\n\nTop\n***\n\nThe manual\n"
                "is here.\n\n* Menu:\n\n* Intro::   The start.\n\n"
                "     example --code\n\n\x1f\nTag Table:\nNode: Top\x7f1\n")
        self.assertEqual(cc.info_paragraphs(text), ["Top", "The manual is here."])

    def test_vim_help(self):
        text = ("*usr_02.txt*\tFor Vim\n\nStart Vim with |:edit| and set 'number' like this: >\n"
                "\tvim file.txt\n<\nThen type.\n")
        self.assertEqual(cc.vim_help_paragraphs(text), [
            "For Vim", "Start Vim with :edit and set number like this:", "Then type."])

    def test_dict_entries(self):
        body = ("apple \\Ap\"ple\\, n. The fleshy fruit of a {rosaceous} tree. [1913 Webster]\n"
                "\napples\n")
        data = body.encode()
        b64 = lambda n: cc._B64[n] if n < 64 else cc._B64[n // 64] + cc._B64[n % 64]
        index = ("00databaseinfo\tA\tB\napple\tA\t%s\nApple\tA\t%s\n" % (b64(len(data)),
                                                                      b64(len(data))))
        self.assertEqual(cc.dict_entries(index, data), [
            ["apple , n. The fleshy fruit of a rosaceous tree. ", "apples"]])


class CleanTest(unittest.TestCase):
    def test_normalises_whitespace(self):
        self.assertEqual(ct.clean_paragraph("  A  sentence\n with\tspaces. "),
                         "A sentence with spaces.")

    def test_drops_code_numbers_and_symbols(self):
        for junk in ["int main(int argc, char **argv) { return 0; }",
                     "0x00 0x1f 0x7f 0xff 1024 2048 4096",
                     "|----+----+----|", "$foo = reduce { $a > $b ? $a : $b } 1..10",
                     "\u4e2d\u6587\u6587\u6863\u7684\u7ffb\u8bd1", "a\x00b text text", ""]:
            self.assertIsNone(ct.clean_paragraph(junk), junk)

    def test_keeps_prose_and_numbered_headings(self):
        self.assertEqual(ct.clean_paragraph(PROSE), PROSE)
        self.assertEqual(ct.clean_paragraph("9.3.2. Class Objects"), "9.3.2. Class Objects")

    def test_english(self):
        self.assertTrue(ct.is_english([PROSE, GPL]))
        self.assertFalse(ct.is_english([GERMAN, GERMAN]))
        self.assertTrue(ct.is_english(["Too short to judge"]))


class SplitTest(unittest.TestCase):
    def test_split_is_a_pure_function_of_the_key(self):
        keys = ["pkg/doc/%d.html" % i for i in range(20000)]
        first = [ct.split_of(k) for k in keys]
        self.assertEqual(first, [ct.split_of(k) for k in keys])
        share = first.count("val") / len(keys)
        self.assertGreater(share, 0.008)
        self.assertLess(share, 0.012)


def fixture():
    """Documents: GPL text in every one, an exact duplicate, a German one, a tiny one."""
    docs = []
    for i in range(400):
        docs.append(("pkg%d/doc/%d.html" % (i % 3, i),
                     ["Introduction", sentence(2 * i), GPL, sentence(2 * i + 1)]))
    docs.append(("copy/doc/0.html", list(docs[0][1])))
    docs.append(("de/doc/0.html", [GERMAN, GERMAN + " Ja.", GERMAN + " Nein."] * 4))
    docs.append(("tiny/doc/0.html", ["Short."]))
    return docs


def build(docs):
    corpus = ct.Corpus()
    out = {"train": [], "val": []}
    for key, paragraphs in docs:
        r = corpus.add(key, paragraphs)
        if r is not None:
            out[r[0]].append(r[1])
    return out, corpus.stats


class CorpusTest(unittest.TestCase):
    def test_dedup(self):
        out, st = build(fixture())
        texts = out["train"] + out["val"]
        self.assertEqual(sum(t.count(GPL) for t in texts), 1)         # kept once
        # Short: kept MAX_SHORT_COPIES times.
        self.assertEqual(sum(t.count("Introduction") for t in texts), ct.MAX_SHORT_COPIES)
        self.assertEqual(st["documents_duplicate"], 1)
        self.assertEqual(st["documents_not_english"], 1)
        self.assertEqual(st["documents_too_short"], 1)
        self.assertEqual(st["documents_kept"], 400)
        self.assertEqual(st["paragraphs_duplicate"], 399)
        self.assertEqual(st["paragraphs_short_repeated"], 400 - ct.MAX_SHORT_COPIES)
        self.assertTrue(all(t.endswith("\n") and "\n\n\n" not in t for t in texts))

    def test_deterministic_and_disjoint(self):
        out1, st1 = build(fixture())
        out2, st2 = build(fixture())
        self.assertEqual((out1, st1), (out2, st2))
        self.assertTrue(out1["val"], "the fixture puts some documents in val")
        train_paragraphs = {p for t in out1["train"] for p in t.split("\n\n")}
        val_paragraphs = {p for t in out1["val"] for p in t.split("\n\n")}
        shared = {p for p in train_paragraphs & val_paragraphs if len(p) >= ct.MIN_DEDUP_CHARS}
        self.assertEqual(shared, set())
        for key, _ in fixture()[:400]:
            self.assertIn(ct.split_of(key), ("train", "val"))

    def test_split_follows_the_key(self):
        out, _ = build(fixture())
        expected_val = [k for k, _ in fixture()[:400] if ct.split_of(k) == "val"]
        self.assertEqual(len(out["val"]), len(expected_val))


if __name__ == "__main__":
    unittest.main()
