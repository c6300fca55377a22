"""Tests of scripts/prepare-corpus's own steps on small fixtures (no network, no packages):
the xz parts are cut at document boundaries and give back the text, and the licences are read
from machine-readable and free-form debian/copyright files."""
import importlib.machinery
import importlib.util
import lzma
import os
import tempfile
import unittest

_HERE = os.path.dirname(os.path.abspath(__file__))
_loader = importlib.machinery.SourceFileLoader("prepare_corpus",
                                               os.path.join(_HERE, "prepare-corpus"))
_spec = importlib.util.spec_from_loader("prepare_corpus", _loader)
pc = importlib.util.module_from_spec(_spec)
_loader.exec_module(pc)


class CompressTest(unittest.TestCase):
    def test_parts_end_at_documents_and_give_back_the_text(self):
        docs = ["Document %d, first paragraph.\n\nSecond paragraph of %d.\n\n\n" % (i, i)
                for i in range(300)]
        text = "".join(docs).encode()
        with tempfile.TemporaryDirectory() as out:
            with open(os.path.join(out, "train.txt"), "wb") as f:
                f.write(text)
            with open(os.path.join(out, "val.txt"), "wb") as f:
                f.write(b"Validation.\n\n\n")
            saved = pc.PART_BYTES
            pc.PART_BYTES = 4000
            try:
                files = pc.compress(out)
            finally:
                pc.PART_BYTES = saved
            parts = [f for f in files if os.path.basename(f).startswith("train.")]
            self.assertGreater(len(parts), 3)
            self.assertEqual([os.path.basename(p) for p in parts],
                             ["train.%02d.txt.xz" % i for i in range(len(parts))])
            back = b""
            for p in parts:
                with lzma.open(p) as f:
                    data = f.read()
                self.assertTrue(data.startswith(b"Document "), data[:40])
                self.assertTrue(data.endswith(b".\n\n\n"), data[-40:])
                back += data
            self.assertEqual(back, text)
            with lzma.open(os.path.join(out, "val.txt.xz")) as f:
                self.assertEqual(f.read(), b"Validation.\n\n\n")


class LicenceTest(unittest.TestCase):
    def test_machine_readable_files_star_first(self):
        text = ("Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\n"
                "Upstream-Name: x\n\nFiles: doc/*\nCopyright: 2020 A\nLicense: CC-BY-SA-4.0\n\n"
                "Files: *\nCopyright: 2020 B\nLicense: GPL-2+\n Long text.\n\n"
                "License: GPL-2+\n On Debian systems ...\n")
        self.assertEqual(pc.licences(text), ["GPL-2+", "CC-BY-SA-4.0"])

    def test_free_form(self):
        text = ("This package was debianized by someone.\n\nThe text is in the public domain.\n"
                "The scripts are under the GNU General Public License, version 2.\n")
        self.assertEqual(pc.licences(text), ["GPL-2", "GPL", "public-domain"])
        self.assertEqual(pc.licences("Nothing known here."), ["see copyright"])

    def test_licence_text_after_license_is_not_a_name(self):
        text = ("Files: *\nCopyright: 2001 PSF\nLicense: Redistribution and use in source and "
                "binary forms, with or without\n modification, are permitted.\n\n"
                "PYTHON SOFTWARE FOUNDATION LICENSE VERSION 2\n")
        self.assertEqual(pc.licences(text), ["PSF"])


if __name__ == "__main__":
    unittest.main()
