"""A chat message's text as Markdown that can only show as text, code and links.

The chat area (Gradio's Chatbot) renders Markdown with marked, then lets the HTML through
Gradio's sanitizer, which keeps tags such as <img>: a message or a reply holding one made the
browser fetch another host. `shown` turns a message, the user's or the model's, into Markdown
in which typed HTML is text, shown as typed, images are links to their address, and code is
code. webui/page/logic/rows.py calls it in one place, for stored turns and a reply being written
alike. The page's Content-Security-Policy (webui/page/routes/csp.py) is the second line: it would
stop a fetch that got past this one. The Chatbot's LaTeX is off (webui/page/ui/chat_panel.py): its
renderer pastes text into the page as HTML, and its `$$` pairs are cut out before Markdown is
read, across code fences.

It stays safe whatever marked makes of the text around it:
- fenced code blocks are found line by line and written back at column 0 with their own fence,
  closed, so marked can only read them as code (and escapes them itself); a `mermaid` fence
  loses its language, since Gradio pastes a mermaid block into the page unescaped. A line that
  starts like a fence but is none (a backtick in its info string) has that start escaped: once
  its code span is a <code> tag it would read as a fence;
- everywhere else `<` and `&` become entities. The only `<` left outside fences are the
  `<code>` tags made here for inline code spans, whose text is escaped, so no reading of the
  text finds any other tag, and no line starts an HTML block;
- `![` becomes `\\![` (an image is a `!` right before a link: it stays a link), and a `[`
  that starts `[label]:` is escaped, since a link definition's title may run over a fence line
  in marked and out the other side.
Pure functions; any thread.
"""

from __future__ import annotations

import bisect
import re

FENCE = re.compile(r"^([ \t]*)(`{3,}|~{3,})(.*)$")
LANGUAGE = re.compile(r"[\w+#.-]*")
PUNCTUATION = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
BRACKET_OR_ESCAPE = re.compile(r"\\.|[\[\]]", re.S)  # an escaped character, or a raw bracket
UNSAFE_LANGUAGES = {"mermaid"}
TEXT_MARKS = re.compile(r"(\\*)(<|&|!\[)")
ENTITIES = {"<": "&lt;", "&": "&amp;"}


def shown(text: str) -> str:
    """`text` as Markdown whose only HTML is text, inline code and fenced code."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    parts: list[tuple[bool, str]] = []  # (is code, text); prose runs are joined before escaping
    prose: list[str] = []
    i = 0
    while i < len(lines):
        opened = _opener(lines[i])
        if opened is None:
            m = FENCE.match(lines[i])  # a fence's start with a backtick after it: kept from being one
            prose.append(lines[i] if m is None else f"{m.group(1)}\\{lines[i][m.end(1) :]}")
            i += 1
            continue
        if prose:
            parts.append((False, "\n".join(prose)))
            prose = []
        indent, fence, language = opened
        closer = re.compile(r"^[ \t]*" + re.escape(fence[0]) + "{" + str(len(fence)) + r",}[`~]*[ \t]*$")
        body, i = [], i + 1
        while i < len(lines) and not closer.match(lines[i]):
            body.append(_dedent(lines[i], indent))
            i += 1
        i += 1  # the closing line, or past the end: closed here either way
        parts.append((True, "\n".join([fence + language, *body, fence])))
    if prose:
        parts.append((False, "\n".join(prose)))

    out, prose_spans, at = [], [], 0
    for is_code, part in parts:
        piece = part if is_code else _prose(part)
        if not is_code:
            prose_spans.append((at, at + len(piece)))
        out.append(piece)
        at += len(piece) + 1
    return _no_definitions("\n".join(out), prose_spans)


def literal(text: str) -> str:
    """`text` as Markdown that shows exactly it, one line: every ASCII punctuation mark
    escaped, `<` and `&` as entities (so it is no tag, wherever marked puts it)."""
    out = []
    for ch in text.replace("\n", " "):
        if ch == "<":
            out.append("&lt;")
        elif ch == "&":
            out.append("&amp;")
        elif ch in PUNCTUATION:
            out.append("\\" + ch)
        else:
            out.append(ch)
    return "".join(out)


def _opener(line: str) -> tuple[str, str, str] | None:
    """(indentation, fence, language) of a fence's opening line, else None. Any indentation
    counts: written back at column 0 it is a fence whatever it was before."""
    m = FENCE.match(line)
    if m is None:
        return None
    indent, fence, info = m.groups()
    if fence[0] == "`" and "`" in info:  # not a fence in CommonMark: inline code
        return None
    named = LANGUAGE.match(info.strip())
    language = named.group() if named else ""
    return indent, fence, "" if language in UNSAFE_LANGUAGES else language


def _dedent(line: str, indent: str) -> str:
    """A code line less the opening fence's indentation, as CommonMark takes it off."""
    n = 0
    while n < len(indent) and n < len(line) and line[n] in " \t":
        n += 1
    return line[n:]


def _prose(text: str) -> str:
    """Text outside fences: inline code spans become <code> with escaped text, the rest has
    `<` and `&` as entities and images as links."""
    closers = _Runs(text)
    out, start, i, n = [], 0, 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "\\" and i + 1 < n and text[i + 1] in PUNCTUATION:
            i += 2  # an escaped mark, a backtick too, opens no code span
            continue
        if ch != "`":
            i += 1
            continue
        j = i
        while j < n and text[j] == "`":
            j += 1
        end = closers.next(j, j - i)
        if end is None:
            i = j  # no matching run: these backticks are text
            continue
        out.append(_text(text[start:i]))
        out.append(_code_span(text[j:end]))
        i = start = end + (j - i)
    out.append(_text(text[start:]))
    return "".join(out)


class _Runs:
    """The backtick runs of a text by length, to find a code span's closing run in log time
    (a text of many unmatched runs must not cost quadratic time on the page's thread)."""

    def __init__(self, text: str):
        self.starts: dict[int, list[int]] = {}
        for m in re.finditer(r"`+", text):
            self.starts.setdefault(m.end() - m.start(), []).append(m.start())
        self.blank_lines = [m.start() for m in re.finditer(r"\n[ \t]*(?=\n)", text)]

    def next(self, after: int, length: int) -> int | None:
        """Where the first run of exactly `length` backticks at or after `after` begins, if
        no blank line comes first (a code span stays in its paragraph)."""
        starts = self.starts.get(length, [])
        k = bisect.bisect_left(starts, after)
        if k == len(starts):
            return None
        b = bisect.bisect_left(self.blank_lines, after)
        if b < len(self.blank_lines) and self.blank_lines[b] < starts[k]:
            return None
        return starts[k]


def _code_span(content: str) -> str:
    content = content.replace("\n", " ")
    if len(content) > 2 and content[0] == content[-1] == " " and content.strip():
        content = content[1:-1]  # CommonMark strips one space each side
    return f"<code>{literal(content)}</code>"


def _text(text: str) -> str:
    """Prose between code spans: `<` and `&` as entities, `![` escaped. A backslash right
    before counts: an odd run of them would escape the entity's `&` (so one more is added),
    and an image already escaped stays as it is."""

    def one(m: re.Match[str]) -> str:
        slashes, mark = m.groups()
        odd = len(slashes) % 2 == 1
        if mark == "![":
            return m.group() if odd else slashes + "\\!["
        return slashes + ("\\" if odd else "") + ENTITIES[mark]

    return TEXT_MARKS.sub(one, text)


def _no_definitions(doc: str, prose_spans: list[tuple[int, int]]) -> str:
    """`doc` with a backslash before every `[` in prose that starts a `[label]:` as marked
    reads one (a label may span lines and hold escaped brackets, so escaping one `[` can
    make the `[` before it a start: the brackets are taken from the right, in one pass)."""
    span_starts = [a for a, _ in prose_spans]

    def in_prose(at: int) -> bool:
        k = bisect.bisect_right(span_starts, at) - 1
        return k >= 0 and at < prose_spans[k][1]

    raw = [m.start() for m in BRACKET_OR_ESCAPE.finditer(doc) if m.group() in "[]"]
    marks, closes = [], None  # where the nearest raw `]` followed by ':' is, if no raw `[` comes first
    for at in reversed(raw):
        if doc[at] == "]":
            closes = at if doc.startswith(":", at + 1) else None
        elif closes is not None and closes > at + 1 and in_prose(at):
            marks.append(at)  # escaped now: the label to its left may run on through it
        else:
            closes = None
    out, last = [], 0
    for at in reversed(marks):
        out += [doc[last:at], "\\"]
        last = at
    return "".join(out) + doc[last:]
