"""Messages as Markdown of text, code and links only (webui/page/logic/markup.py, logic.row).

For any text, what the chat area gets has, outside the fences written at column 0, no `<`
but the <code> tags made for inline code, no image and no link definition; every fence is
closed and none is a mermaid block. Examples check that code and HTML show as typed. What
the browser really makes of it (Gradio's marked) is tests/test_page_safety.py.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st

from radixchat.core.store import Message, RequestFigures
from radixchat.webui.page.logic.chat_page import chat_rows, row
from radixchat.webui.page.logic.markup import literal, shown

FENCE_LINE = re.compile(r"^(`{3,}|~{3,})[\w+#.-]*$")


def prose_of(out: str) -> str:
    """The text outside the fences of `shown`'s output (fences are at column 0, closed by
    their own fence); fails if a fence is left open."""
    prose, fence = [], None
    for line in out.split("\n"):
        if fence is None:
            m = FENCE_LINE.match(line)
            if m:
                fence = m.group(1)
                assert not re.match(r"```mermaid\s*$", line), out  # Gradio's mermaid block: unescaped
            else:
                prose.append(line)
        elif line == fence:
            fence = None
    assert fence is None, f"an open fence in {out!r}"
    return "\n".join(prose)


def assert_safe(out: str) -> None:
    prose = prose_of(out)
    assert "<" not in re.sub(r"</?code>", "", prose), out
    for m in re.finditer(r"(\\*)!\[", prose):
        assert len(m.group(1)) % 2 == 1, out  # every `![` escaped: no image
    for m in re.finditer(r"(\\*)\[(?=(?:\\.|[^\[\]\\])+\]:)", prose):
        assert len(m.group(1)) % 2 == 1, out  # no link definition
    for line in prose.split("\n"):
        assert not re.match(r"\s*</?code>\s*$", line), out  # no line that could open an HTML block
        fence = re.match(r" {0,3}(`{3,}|~{3,})(.*)$", line)  # nor a fence marked would see
        assert not fence or (fence.group(1)[0] == "`" and "`" in fence.group(2)), out


MARKS = st.sampled_from(
    [
        "<",
        ">",
        "&",
        "`",
        "```",
        "~~~",
        "```mermaid",
        "\n",
        "\n\n",
        "  ",
        "    ",
        "\\",
        "!",
        "[",
        "]",
        "(",
        ")",
        ":",
        '"',
        "![a](http://x/i)",
        "[l]: /u",
        "<img src=x>",
        "<script>",
        "$$",
        "- ",
        "> ",
        "1. ",
        "a",
        "b c",
        "\t",
        "\r\n",
        "```py",
        "`` ` ``",
    ]
)


@settings(max_examples=400, deadline=None)
@given(st.lists(MARKS, max_size=40).map("".join))
def test_any_text_is_shown_without_tags_images_or_definitions(text):
    assert_safe(shown(text))


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200))
def test_any_unicode_text_is_shown_safely(text):
    assert_safe(shown(text))


def test_html_shows_as_typed_and_images_become_links():
    out = shown('hi <img src="http://h/a?leak=1"> <script>x=1</script> &lt; ![pic](http://h/b) [a](http://h/c)')
    assert out == (
        'hi &lt;img src="http://h/a?leak=1"> &lt;script>x=1&lt;/script> &amp;lt; \\![pic](http://h/b) [a](http://h/c)'
    )


def test_code_stays_code():
    fenced = "Look:\n  ```python\n  if a < b and c & d:\n      pass\n  ```\nafter <b>"
    assert shown(fenced) == "Look:\n```python\nif a < b and c & d:\n    pass\n```\nafter &lt;b>"
    assert shown("```\nopen <x>") == "```\nopen <x>\n```"  # closed, so what follows is not code
    assert shown("~~~~ sh\n~~~\n~~~~~") == "~~~~sh\n~~~\n~~~~"
    assert shown("use `a < b` or ``x`y``") == "use <code>a &lt; b</code> or <code>x\\`y</code>"
    assert shown("`` `<x>` ``") == "<code>\\`&lt;x\\>\\`</code>"
    assert shown("no `span\n\nhere <`") == "no `span\n\nhere &lt;`"  # not across paragraphs
    # a backtick in the info: not a fence, and it must not turn into one once its code span is <code>
    assert shown("```js `x`\ny") == "\\```js <code>x</code>\ny"


def test_what_would_escape_the_fences_is_taken_apart():
    assert shown("```mermaid\ngraph TD; A-->B\n```") == "```\ngraph TD; A-->B\n```"
    # a definition's title or label running over a fence line would leave the fence's body as Markdown
    assert shown('[a]: /u "x\n```\n"\n<img src=y>\n```').startswith("\\[a]: /u")
    assert shown("[a\n```\nb]: /u\n<img>\n```").startswith("\\[a\n")
    # backslashes before a mark: an escaped image stays escaped, an escaped backslash does not hide one
    assert shown("\\![x](y)") == "\\![x](y)"
    assert shown("\\\\![x](y)") == "\\\\\\![x](y)"
    assert shown("\\<b>") == "\\\\&lt;b>"


def test_literal_is_one_escaped_line():
    assert literal("a*b_[c](d)\n<e>&") == "a\\*b\\_\\[c\\]\\(d\\) &lt;e\\>&amp;"


def test_many_unmatched_backticks_cost_little():
    import time

    text = "".join("`" * (1 + i % 50) + " x " for i in range(20_000))
    t0 = time.perf_counter()
    assert_safe(shown(text))
    assert time.perf_counter() - t0 < 5  # quadratic would take minutes


def test_rows_of_history_and_of_a_reply_being_written_go_through_markup():
    hostile = '<img src="http://h/a">'
    history = [Message(1, 1, "user", hostile, 0.0, None), Message(2, 1, "assistant", hostile, 0.0, 7)]
    figures = {
        7: RequestFigures(
            prompt_tokens=3, cached_tokens=0, ttft_ms=5.0, decode_tps=10.0, finish_reason="stop", error=None
        )
    }
    rows = chat_rows(history, figures)
    assert [r["content"].split("\n")[0] for r in rows] == ['&lt;img src="http://h/a">'] * 2
    assert 'class="rc-stats"' in rows[1]["content"]
    live = chat_rows(history[:1], {}, streaming=hostile)[-1]["content"]
    assert live == row("assistant", hostile, streaming=True)["content"] == '&lt;img src="http://h/a"> ▍'
