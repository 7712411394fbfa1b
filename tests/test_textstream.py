"""Stop strings and held-back text, without a model."""

from radixchat.core.engine.textstream import TextStream


class CharDetok:
    """A stand-in streaming detokenizer whose tokens are single characters."""

    def __init__(self):
        self.last_segment = ""

    def add_token(self, token):
        self.last_segment = chr(token)

    def finalize(self):
        self.last_segment = ""


def run(text, stops):
    ts = TextStream(CharDetok(), stops)
    out = [ts.add(ord(c)) for c in text]
    out.append(ts.finish())
    return "".join(out), ts


def test_no_stops_passes_everything():
    sent, ts = run("hello world", [])
    assert sent == "hello world" and not ts.stopped


def test_stop_string_is_cut_and_never_sent():
    sent, ts = run("hello END world", ["END"])
    assert sent == "hello " and ts.text == "hello " and ts.stopped


def test_partial_stop_is_held_back_then_released():
    ts = TextStream(CharDetok(), ["STOP"])
    assert ts.add(ord("a")) == "a"
    assert ts.add(ord("S")) == ""  # could begin "STOP"
    assert ts.add(ord("T")) == ""
    assert ts.add(ord("x")) == "STx"  # it did not
    assert ts.finish() == ""


def test_held_back_prefix_flushed_at_finish():
    sent, ts = run("abcST", ["STOP"])
    assert sent == "abcST" and not ts.stopped


def test_earliest_of_several_stops_wins():
    sent, _ = run("one two three", ["three", "two"])
    assert sent == "one "
