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


def test_a_character_cut_by_the_last_token_is_held_back_not_sent_as_a_replacement():
    # byte-level BPE spells an emoji over several tokens: a reply cut (max_tokens) between
    # them must end before it, not in U+FFFD (seen in 2 of 25 cut replies)
    from pathlib import Path

    from mlx_lm.tokenizer_utils import NaiveStreamingDetokenizer
    from mlx_lm.tokenizer_utils import load as load_tokenizer

    tok = load_tokenizer(Path(__file__).parents[1] / "assets" / "model")
    tokens = tok.encode("ok 🙂🙂", add_special_tokens=False)
    whole = tok.decode(tokens)
    for detok in (tok.detokenizer, NaiveStreamingDetokenizer(tok)):
        for cut in range(1, len(tokens) + 1):
            detok.reset()
            ts = TextStream(detok, [])
            sent = "".join(ts.add(t) for t in tokens[:cut]) + ts.finish()
            assert "\ufffd" not in sent and whole.startswith(sent), (type(detok).__name__, cut, sent)
        assert sent == whole
