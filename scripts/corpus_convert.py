"""Converters from the formats Debian ships documentation in to paragraphs of plain text, for
Keel's English corpus (scripts/prepare-corpus; docs/corpus.md): HTML and Mallard
(html_paragraphs), rendered man pages (rendered_man_paragraphs), GNU info (info_paragraphs),
reStructuredText / Markdown / plain text (plain_paragraphs), POD (pod_paragraphs), Vim help
(vim_help_paragraphs) and dictd databases (dict_entries). A paragraph is one string: the
converters unwrap hard-wrapped lines and drop code listings where the format marks them;
cleaning is corpus_text's. Tested in corpus_text_test.py.

Python 3 standard library only (Debian's python3).
"""
import html.parser
import re

from corpus_text import normalize_space

# ----------------------------------------------------------------------------------------------
# HTML.

# Elements whose whole content is dropped: not text (script, style), page furniture (nav,
# header, footer) and code listings (pre; Mallard's screen); Mallard's page metadata (info).
_SKIP_TAGS = frozenset("""script style head nav header footer noscript svg math button form
select textarea iframe object pre template canvas map screen info media""".split())
# Elements with one of these class names, ids or roles are navigation or furniture in the
# generators Debian's documentation comes from (Sphinx, DocBook, Javadoc, Doxygen, rustdoc,
# Texinfo, Scribble, Haddock, Qt's qdoc).
_SKIP_CLASSES = frozenset("""sphinxsidebar sphinxsidebarwrapper related footer navigation
nav navbar sidebar breadcrumb breadcrumbs toc toctree-wrapper headerlink navheader navfooter
top-nav sub-nav bottom-nav legal-copy highlight highlight-default highlight-python
highlight-c highlight-shell literal-block programlisting screen synopsis funcsynopsis
cmdsynopsis doc-source copyright navigation-bar mobile-nav menu-wrapper
sourceCode example-code code-block linenodiv tocnav tocsect navbar-header navfoot
navhead memproto memtemplate fragment
""".split())
_SKIP_ROLES = frozenset("navigation banner contentinfo search menu".split())
_VOID_TAGS = frozenset("area base br col embed hr img input link meta param source track wbr".split())
# Elements that end a paragraph (HTML's, and Mallard's for GNOME's help pages).
_BLOCK_TAGS = frozenset("""p div li dt dd h1 h2 h3 h4 h5 h6 tr td th blockquote section article
table ul ol dl br hr caption figcaption figure main aside body html title address details
summary center tbody thead tfoot item note list terms steps tree page""".split())


class _HtmlText(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.paragraphs = []
        self._parts = []
        self._link_chars = 0
        self._in_link = 0
        self._skip_tag = None   # the tag whose content is being dropped
        self._skip_depth = 0

    def _flush(self):
        text = normalize_space("".join(self._parts))
        if text:
            # A paragraph that is all link text and short is a table-of-contents or index
            # entry, not prose.
            link_heavy = self._link_chars >= 0.9 * len(text)
            if not (link_heavy and len(text.split()) < 12):
                self.paragraphs.append(text)
        self._parts = []
        self._link_chars = 0

    def _skips(self, tag, attrs):
        if tag in _SKIP_TAGS:
            return True
        for name, value in attrs:
            if value is None:
                continue
            if name == "class" and any(c in _SKIP_CLASSES for c in value.split()):
                return True
            if name == "id" and value in _SKIP_CLASSES:
                return True
            if name == "role" and value in _SKIP_ROLES:
                return True
            if name == "hidden" or (name == "aria-hidden" and value == "true"):
                return True
        return False

    def handle_starttag(self, tag, attrs):
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth += 1
            return
        if tag in _VOID_TAGS:
            if tag in ("br", "hr"):
                self._flush()
            return
        if self._skips(tag, attrs):
            self._flush()
            self._skip_tag, self._skip_depth = tag, 1
            return
        if tag in _BLOCK_TAGS:
            self._flush()
        elif tag == "a":
            self._in_link += 1

    def handle_startendtag(self, tag, attrs):
        if self._skip_tag is None and tag in ("br", "hr"):
            self._flush()

    def handle_endtag(self, tag):
        if self._skip_tag is not None:
            if tag == self._skip_tag:
                self._skip_depth -= 1
                if self._skip_depth == 0:
                    self._skip_tag = None
            return
        if tag in _BLOCK_TAGS:
            self._flush()
        elif tag == "a" and self._in_link:
            self._in_link -= 1

    def handle_data(self, data):
        if self._skip_tag is not None:
            return
        self._parts.append(data)
        if self._in_link:
            self._link_chars += len(data.strip())


def html_paragraphs(text):
    """The paragraphs of an HTML page's readable text: block elements end paragraphs; scripts,
    styles, navigation, headers, footers and code listings (<pre>, highlighted blocks) are
    dropped; short paragraphs that are all link text (tables of contents, indexes) too."""
    parser = _HtmlText()
    parser.feed(text)
    parser.close()
    parser._flush()
    return parser.paragraphs


# ----------------------------------------------------------------------------------------------
# Plain text: reStructuredText, Markdown, README-like text, rendered man and info pages.

_BULLET = re.compile(r"^\s*(?:[-*+\u2022\u00b7o]|\d+[.)]|[a-zA-Z][.)]|#\.)\s+")


def _unwrap(block_lines):
    """A block of lines (no blank line) -> paragraphs: hard-wrapped prose becomes one line; a
    list starts a new paragraph at every item."""
    out, cur = [], []
    for line in block_lines:
        if _BULLET.match(line) and cur:
            out.append(" ".join(cur))
            cur = []
        cur.append(line.strip())
    if cur:
        out.append(" ".join(cur))
    return out


def _blocks(lines):
    """Blank-line separated blocks of lines."""
    block = []
    for line in lines:
        if line.strip():
            block.append(line.rstrip())
        elif block:
            yield block
            block = []
    if block:
        yield block


_MAN_HYPHEN = re.compile(r"(\w)[\u2010-] (\w)")
_RST_ROLE = re.compile(r":[A-Za-z:+-]+:`([^`]*)`")
_RST_REF = re.compile(r"`([^`<]*?)\s*<[^>]*>`__?")
_RST_LITERAL = re.compile(r"``([^`]*)``")
_MD_LINK = re.compile(r"\[([^\]]*)\]\([^)]*\)")
_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+_.:])\1{2,}\s*$")


def _inline_markup(p):
    p = _RST_ROLE.sub(lambda m: re.sub(r"\s*<[^>]*>$", "", m.group(1)).lstrip("~!"), p)
    p = _RST_REF.sub(r"\1", p)
    p = _RST_LITERAL.sub(r"\1", p)
    p = _MD_LINK.sub(r"\1", p)
    p = re.sub(r"(?<![\w*])\*\*([^*]+)\*\*(?![\w*])", r"\1", p)
    p = re.sub(r"`([^`]+)`_?", r"\1", p)
    return p


def plain_paragraphs(text):
    """Paragraphs of reStructuredText, Markdown or plain text.

    Dropped: indented blocks that follow a paragraph ending in '::' and reST directives with
    their indented bodies (literal and code blocks, tables of contents), fenced (```) and
    indented Markdown code, section underlines, and comment lines. Kept text loses reST roles,
    ``literals`` and link targets, and Markdown link targets and ** emphasis.
    """
    lines = text.replace("\t", "        ").split("\n")
    # Fenced code first: it may contain blank lines.
    kept, fenced = [], False
    for line in lines:
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            kept.append("")
            continue
        kept.append("" if fenced else line)
    out = []
    literal_indent = None  # inside a literal block or directive body: its base indentation
    after_colons = False
    for block in _blocks(kept):
        indent = len(block[0]) - len(block[0].lstrip())
        if literal_indent is not None:
            if indent > literal_indent:
                continue
            literal_indent = None
        first = block[0].strip()
        if first.startswith(".. ") or first == "..":
            literal_indent = indent
            continue
        if after_colons and indent > 0:
            literal_indent = indent - 1
            continue
        lines_kept = [l for l in block if not _RST_UNDERLINE.match(l.strip())]
        if not lines_kept:
            continue
        if indent >= 4 and not _BULLET.match(block[0]) and out and out[-1].endswith(":"):
            continue  # an indented code block introduced by a sentence ending in ':'
        after_colons = lines_kept[-1].rstrip().endswith("::")
        for p in _unwrap(lines_kept):
            p = p.lstrip("#").strip() if p.startswith("#") else p
            if p.endswith("::"):
                p = p[:-1]
            out.append(_inline_markup(p))
    return out


def rendered_man_paragraphs(text):
    """Paragraphs of a man page rendered to plain text (groff -Tutf8 with SGR and overstrike
    off): the running header and footer lines go, a heading (a short line indented less than
    the line after it) is a paragraph of its own, wrapped lines are joined and words groff
    hyphenated at a line end are whole again."""
    lines = text.split("\n")
    # The first and last non-blank lines are the page's header and footer.
    nonblank = [i for i, l in enumerate(lines) if l.strip()]
    if len(nonblank) >= 2:
        lines[nonblank[0]] = ""
        lines[nonblank[-1]] = ""
    out = []
    for block in _blocks(lines):
        while len(block) > 1:
            indent = len(block[0]) - len(block[0].lstrip())
            next_indent = len(block[1]) - len(block[1].lstrip())
            if indent < next_indent and len(block[0].strip()) < 60:
                out.append(block[0].strip())
                block = block[1:]
            else:
                break
        out.extend(_unwrap(block))
    return [_MAN_HYPHEN.sub(r"\1\2", p) for p in out]


def info_paragraphs(text):
    """Paragraphs of a GNU info file: node headers, menus, the tag table and the indirect
    table go; what is left is plain text."""
    out = []
    for node in text.split("\x1f"):
        body = node.lstrip("\n")
        if body.startswith(("Tag Table:", "Indirect:", "End Tag Table", "Local Variables")):
            continue
        lines = body.split("\n")
        if lines and lines[0].startswith("File: "):
            lines = lines[1:]
        kept, in_menu = [], False
        for line in lines:
            if line.startswith("* Menu:"):
                in_menu = True
                continue
            if in_menu:
                if line.startswith("* ") or line.startswith(" ") or not line.strip():
                    continue
                in_menu = False
            if line.startswith("* ") and "::" in line:
                continue
            if _RST_UNDERLINE.match(line.strip()):
                continue
            kept.append(line)
        for block in _blocks(kept):
            indent = len(block[0]) - len(block[0].lstrip())
            if indent >= 5 and not _BULLET.match(block[0]):
                continue  # an example (texinfo's @example is indented by 5)
            out.extend(_unwrap(block))
    return out


# ----------------------------------------------------------------------------------------------
# POD.

_POD_CODE = re.compile(r"[A-Z]<<+\s+(.*?)\s+>>+|[A-Z]<([^<>]*)>")


def _pod_inline(p):
    def sub(m):
        inner = m.group(1) if m.group(1) is not None else m.group(2)
        code = m.group(0)[0]
        if code == "L":
            inner = inner.split("|", 1)[0] if "|" in inner else inner.split("/", 1)[0] or inner
            inner = inner.strip('"')
        elif code == "E":
            return {"lt": "<", "gt": ">", "verbar": "|", "sol": "/"}.get(inner, "")
        elif code in "XZ":
            return ""
        return inner
    for _ in range(4):  # nested codes: innermost first
        q = _POD_CODE.sub(sub, p)
        if q == p:
            break
        p = q
    return p


def pod_paragraphs(text):
    """Paragraphs of a POD document: =head lines become headings, =item texts items; verbatim
    (indented, code) paragraphs, =begin/=for blocks and =cut code go; formatting codes
    (B<>, C<>, L<>, E<>...) are reduced to their text."""
    out = []
    in_pod = text.lstrip().startswith("=")
    skipping = False
    for block in _blocks(text.split("\n")):
        first = block[0]
        if first.startswith("=cut"):
            in_pod = False
            continue
        if first.startswith("="):
            in_pod = True
            cmd, _, rest = first.partition(" ")
            if cmd == "=begin":
                skipping = True
            elif cmd == "=end":
                skipping = False
            elif cmd in ("=head1", "=head2", "=head3", "=head4", "=item") and not skipping:
                body = " ".join([rest] + [l.strip() for l in block[1:]]).strip()
                if body and body not in ("*", "-") and not re.fullmatch(r"\d+\.?", body):
                    out.append(_pod_inline(body))
            continue
        if not in_pod or skipping or first[:1] in (" ", "\t"):
            continue
        out.extend(_pod_inline(p) for p in _unwrap(block))
    return out


# ----------------------------------------------------------------------------------------------
# dictd databases (.index + .dict).

_B64 = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"


def _b64_number(s):
    n = 0
    for c in s:
        n = n * 64 + _B64.index(c)
    return n


_DICT_PRONUNCIATION = re.compile(r"\\[^\\\n]{1,80}\\")
_DICT_SOURCE = re.compile(r"\[(?:[^\]]*Webster[^\]]*|PJC|RN|Century Dict\.|WordNet[^\]]*)\]")
_DICT_BRACES = re.compile(r"\{([^{}]*)\}")


def dict_markup(p):
    """A dictd paragraph without GCIDE's pronunciation keys (\\An*nel"i*dous\\), source tags
    ([1913 Webster]) and cross-reference braces ({annelid} -> annelid)."""
    p = _DICT_PRONUNCIATION.sub("", p)
    p = _DICT_SOURCE.sub("", p)
    return _DICT_BRACES.sub(r"\1", p)


def dict_entries(index_text, dict_bytes):
    """The entries of a dictd database in file order, each a list of paragraphs: the index's
    (headword, offset, length) lines locate them; entries several headwords share appear once;
    the database's own 00-database-* entries are skipped."""
    spans = set()
    for line in index_text.split("\n"):
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00database") or parts[0].startswith("00-database"):
            continue
        spans.add((_b64_number(parts[1]), _b64_number(parts[2])))
    entries = []
    for offset, length in sorted(spans):
        text = dict_bytes[offset:offset + length].decode("utf-8", "replace")
        paragraphs = []
        for block in _blocks(text.split("\n")):
            paragraphs.extend(dict_markup(p) for p in _unwrap(block))
        entries.append(paragraphs)
    return entries


# ----------------------------------------------------------------------------------------------
# Vim's help files.

_VIM_TAG = re.compile(r"\*[^*\s|]+\*")
_VIM_LINK = re.compile(r"\|([^|\s]+)\|")
_VIM_OPTION = re.compile(r"'([a-z]{2,})'")


def vim_help_paragraphs(text):
    """Paragraphs of a Vim help file: *tags* go, |links| and 'options' keep their text,
    examples (from a line ending in '>' to a line starting with '<' or unindented text) and
    ====/---- rules go."""
    kept, in_example = [], False
    for line in text.split("\n"):
        if in_example:
            if line.startswith("<") or (line and not line[0].isspace()):
                in_example = False
                line = line[1:] if line.startswith("<") else line
            else:
                continue
        if line.rstrip().endswith(">") and (line.rstrip() == ">" or line.rstrip()[-2:-1] == " "):
            in_example = True
            line = line.rstrip()[:-1]
        if _RST_UNDERLINE.match(line.strip()):
            line = ""
        line = _VIM_TAG.sub("", line)
        line = _VIM_LINK.sub(r"\1", line)
        kept.append(_VIM_OPTION.sub(r"\1", line))
    return [p for b in _blocks(kept) for p in _unwrap(b)]
