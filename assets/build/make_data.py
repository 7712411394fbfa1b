"""Build the question/answer records the bundled model learns from.

Sources are texts that ship with every CPython: the reference topics behind `help()`
(`pydoc_data.topics`) and the docstrings of builtins and common standard-library modules.
Each subject (a statement, a function, a module...) becomes one record: a few phrasings of a
question, one short answer, and a split ("train" or "valid", chosen by a hash of the subject so
that adding subjects does not reshuffle the others).

It does not tokenize, pick system prompts or pack conversations: that is `chat_data.py`'s job.
The output depends on the Python version (docstrings change between releases); the model card
records the version used.
"""

import builtins
import importlib
import inspect
import json
import re
import zlib
from pathlib import Path
from pydoc_data.topics import topics

ASSETS = Path(__file__).resolve().parents[1]

# Common modules only: the model has a few million parameters, and a smaller set of subjects
# seen many times gives on-topic answers where a larger set seen once would not.
MODULES = [
    "os",
    "os.path",
    "sys",
    "json",
    "re",
    "math",
    "random",
    "itertools",
    "functools",
    "collections",
    "datetime",
    "time",
    "pathlib",
    "string",
    "textwrap",
    "shutil",
    "subprocess",
    "dataclasses",
    "enum",
    "statistics",
    "heapq",
    "bisect",
    "copy",
    "csv",
    "hashlib",
    "base64",
    "uuid",
    "logging",
    "argparse",
    "tempfile",
    "glob",
    "operator",
    "contextlib",
    "io",
    "pickle",
    "struct",
    "threading",
    "queue",
    "typing",
    "urllib.parse",
    "sqlite3",
    "decimal",
    "fractions",
    "pprint",
    "secrets",
    "zipfile",
    "gzip",
    "unittest",
]
# Names too common to leave to the cap below (os alone exports over 300), the scenario
# questions' subjects among them.
COMMON = set(
    [
        "os.listdir",
        "os.getcwd",
        "os.makedirs",
        "os.remove",
        "os.rename",
        "os.walk",
        "os.getenv",
        "os.path.join",
        "os.path.exists",
        "os.path.basename",
        "os.path.splitext",
        "json.dumps",
        "json.loads",
        "json.dump",
        "json.load",
        "re.sub",
        "re.findall",
        "re.search",
        "re.match",
        "re.compile",
        "random.choice",
        "random.randint",
        "random.shuffle",
        "itertools.chain",
        "itertools.product",
        "itertools.groupby",
        "functools.lru_cache",
        "functools.partial",
        "functools.reduce",
        "functools.wraps",
        "collections.Counter",
        "collections.defaultdict",
        "collections.namedtuple",
        "collections.deque",
        "subprocess.run",
        "pathlib.Path",
        "time.sleep",
        "time.time",
        "math.sqrt",
        "math.floor",
        "math.ceil",
        "sys.exit",
        "shutil.copy",
        "shutil.rmtree",
        "heapq.heappush",
        "heapq.heappop",
        "bisect.bisect_left",
        "csv.reader",
        "csv.writer",
        "hashlib.sha256",
        "uuid.uuid4",
        "datetime.datetime",
        "copy.deepcopy",
        "dataclasses.dataclass",
    ]
)
BUILTIN_TYPES = ["str", "list", "dict", "set"]
MAX_PER_MODULE = 10
MAX_WORDS = 28

QUESTIONS = {
    "function": [
        "What does {n} do?",
        "What is {n} used for?",
        "How do I use {n}?",
        "Explain {n} in Python.",
        "What does the {n} function do?",
    ],
    "method": [
        "What does {n} do?",
        "What is {n} used for?",
        "How do I use {n}?",
        "Explain the {n} method.",
        "What does the {n} method do?",
    ],
    "class": [
        "What is {n}?",
        "What is {n} used for?",
        "How do I use {n}?",
        "Explain the {n} class.",
        "What is the {n} class in Python?",
    ],
    "module": [
        "What is the {n} module?",
        "What is the {n} module for?",
        "What does the {n} module do?",
        "Tell me about the {n} module.",
        "When should I use the {n} module?",
    ],
    "topic": [
        "What is {n}?",
        "Explain {n}.",
        "Tell me about {n} in Python.",
        "How does {n} work in Python?",
        "Can you explain {n}?",
    ],
}

# Docstrings start most summaries with an imperative ("Return the ..."); turning it into the
# third person lets an answer read as a sentence about its subject.
VERBS = [
    "Return",
    "Create",
    "Convert",
    "Remove",
    "Add",
    "Get",
    "Set",
    "Make",
    "Compute",
    "Calculate",
    "Open",
    "Close",
    "Read",
    "Write",
    "Test",
    "Raise",
    "Call",
    "Construct",
    "Decode",
    "Encode",
    "Format",
    "Split",
    "Join",
    "Insert",
    "Append",
    "Extend",
    "Delete",
    "Update",
    "Apply",
    "Copy",
    "Change",
    "Wait",
    "Start",
    "Run",
    "Execute",
    "Load",
    "Find",
    "Search",
    "Match",
    "Replace",
    "Parse",
    "Sort",
    "Reverse",
    "Count",
    "Print",
    "Register",
    "Initialize",
    "Determine",
    "Produce",
    "Generate",
    "Build",
    "Acquire",
    "Release",
    "Put",
    "Iterate",
    "Yield",
    "Pack",
    "Unpack",
    "Compress",
    "Decompress",
    "Escape",
    "Shift",
    "Truncate",
]


def third_person(verb):
    if verb.endswith("y") and verb[-2] not in "aeiou":
        return verb[:-1] + "ies"
    if verb.endswith(("s", "sh", "ch", "x")):
        return verb + "es"
    return verb + "s"


def shorten(text):
    """Whole sentences up to MAX_WORDS words (at least one sentence, cut if it is huge)."""
    text = re.sub(r"\s+", " ", text.replace("``", "`")).strip()
    out, words = [], 0
    for sentence in re.split(r"(?<=[.!?])\s+(?=[A-Z`(])", text):
        n = len(sentence.split())
        if out and words + n > MAX_WORDS:
            break
        out.append(sentence)
        words += n
    text = " ".join(out)
    if words > MAX_WORDS + 20:
        text = " ".join(text.split()[:MAX_WORDS]) + " ..."
    # Summaries that introduce a grammar block ("... for a group of statements:") end here.
    return text[:-1] + "." if text.endswith(":") else text


def pydoc_markup(text):
    # In pydoc's plain text, code is in straight double quotes and emphasis in *stars*.
    text = re.sub(r'"([^"\n]+)"', r"`\1`", text)
    text = re.sub(r"(?<![\w*`])\*([A-Za-z_][\w ]*?)\*(?![\w*])", r"\1", text)
    return re.sub(r" \[\d+\]", "", text)


def prose(paragraphs):
    """The first paragraphs that are sentences, not signatures, tables, grammar or code."""
    keep = []
    for p in paragraphs:
        lines = [ln.strip() for ln in p.strip().splitlines()]
        # C docstrings open with signature lines ("map(func, *iterables) --> map object").
        while lines and re.fullmatch(r"[\w.]+\(.*\)\s*(-+>.*)?|[\w.]+ -+> .*", lines[0]):
            lines.pop(0)
        if not lines or not lines[0]:
            continue
        if any(re.fullmatch(r"[=*-]+", ln) for ln in lines):
            break
        if lines[0][0] in "+|>=-" or "::=" in p or lines[0].endswith("::"):
            if keep:
                break
            continue
        if re.match(r"(New|Changed) in version|Deprecated since", lines[0]):
            continue
        keep.append(" ".join(lines))
        # A docstring's first paragraph is its summary; what follows is often argument lists.
        if sum(len(k.split()) for k in keep) >= 12:
            break
    return " ".join(keep)


def paragraphs(text):
    return re.split(r"\n\s*\n", text)


def pydoc_records():
    for key in sorted(topics):
        lines = topics[key].split("\n")
        title = lines[0].strip()
        body = "\n".join(lines[2:])
        yield "topic", topic_name(title), prose(paragraphs(pydoc_markup(body)))
        for i in range(2, len(lines) - 1):
            under = lines[i + 1]
            if (
                re.fullmatch(r"=+|-+", under)
                and len(under) == len(lines[i])
                and lines[i].strip() not in ("", "Overview")
            ):
                rest = "\n".join(lines[i + 2 :])
                yield "topic", topic_name(lines[i]), prose(paragraphs(pydoc_markup(rest))[:3])
        for i, line in enumerate(lines[:-2]):
            m = re.match(r"^(?:class |exception )?([A-Za-z_][\w.]*)\((.*)\)$", line)
            if m and lines[i + 1] == "" and lines[i + 2].startswith("   "):
                block = inspect.cleandoc("\n".join(lines[i + 2 : i + 40]))
                kind = "method" if "." in m[1] else "function"
                yield kind, f"{m[1]}({m[2]})", prose(paragraphs(pydoc_markup(block))[:2])


def topic_name(title):
    title = pydoc_markup(title.strip())
    # "Sequence Types — list, tuple, range" asks better as "sequence types".
    title = title.split(" — ")[0].split(": ")[0]
    return " ".join(w if w in KEEP_CASE or not re.fullmatch(r"[A-Z][a-z]+", w) else w.lower() for w in title.split())


KEEP_CASE = {"None", "NotImplemented", "Ellipsis", "Python", "Unicode"}


def signature(name, obj):
    try:
        sig = str(inspect.signature(obj))
    except (TypeError, ValueError):
        sig = "()"
    # "(self, /, sep=None)" is how C methods introspect; users write "(sep=None)".
    sig = re.sub(r"^\(self(, )?", "(", sig).replace("(/, ", "(").replace(", /", "")
    # Long signatures are many hard-to-predict tokens for little help to a reader.
    return name + (sig if len(sig) <= 24 else "(...)")


def docstring_records():
    targets = [("builtins", builtins)] + [(m, importlib.import_module(m)) for m in MODULES]
    for modname, module in targets:
        if modname != "builtins":
            yield "module", modname, prose(paragraphs(inspect.getdoc(module) or ""))
        # Names the module exports first, then a fixed pseudo-random order: alphabetical order
        # would keep only the names that start with early letters.
        public = set(getattr(module, "__all__", []))
        names = sorted(
            (n for n in vars(module) if not n.startswith("_")),
            key=lambda n: (f"{modname}.{n}" not in COMMON, n not in public, zlib.crc32(n.encode())),
        )
        count = 0
        for n in names:
            obj = getattr(module, n)
            # Skip names imported from other public modules; keep those a module re-exports
            # from its C accelerator (_functools, posix, io...).
            home = getattr(obj, "__module__", None) or modname
            if home not in (modname, "posix", "io") and home.lstrip("_") != modname and modname != "os.path":
                continue
            if modname != "builtins" and count >= MAX_PER_MODULE:
                break
            full = n if modname == "builtins" else f"{modname}.{n}"
            if inspect.isclass(obj):
                if issubclass(obj, (Warning, BaseException)) and n != "Exception":
                    continue
                # getdoc would inherit a parent's docstring, which describes another class.
                yield "class", full, prose(paragraphs(inspect.cleandoc(obj.__doc__ or "")))
            elif callable(obj):
                yield "function", signature(full, obj), prose(paragraphs(inspect.getdoc(obj) or ""))
            else:
                continue
            count += 1
    for tname in BUILTIN_TYPES:
        t = getattr(builtins, tname)
        for n in sorted(vars(t)):
            if not n.startswith("_") and callable(getattr(t, n)):
                doc = inspect.getdoc(getattr(t, n)) or ""
                yield "method", signature(f"{tname}.{n}", getattr(t, n)), prose(paragraphs(doc))


def answer_text(kind, subject, text):
    if kind == "topic":
        return text
    first, _, rest = text.partition(" ")
    code = f"`{subject}`" if kind != "module" else f"The `{subject}` module"
    if first in VERBS:
        return f"{code} {third_person(first).lower()} {rest}"
    return f"{code}: {text}"


def bare_name(kind, subject):
    return subject.split("(")[0] if kind in ("function", "method") else subject


def build(protected=()):
    records, seen = [], set()
    # Docstrings come before pydoc's definitions: pydoc also documents helpers such as
    # "len(dictview)" that would take the name of the builtin.
    pydoc = list(pydoc_records())
    sources = (
        [r for r in pydoc if r[0] == "topic"]
        + list(docstring_records())
        + [r for r in pydoc if r[0] != "topic" and "." in r[1].split("(")[0]]
    )
    for kind, subject, text in sources:
        name = bare_name(kind, subject)
        text = shorten(text)
        if len(text.split()) < 5 or name in seen:
            continue
        seen.add(name)
        questions = [q.format(n=name) for q in QUESTIONS[kind]]
        holdout = zlib.crc32(name.encode()) % 20 == 0 and name not in protected
        records.append(
            {
                "subject": name,
                "kind": kind,
                "questions": questions,
                "answer": answer_text(kind, subject, text),
                "split": "valid" if holdout else "train",
                "core": name in protected,
            }
        )
    for i, (questions, answer) in enumerate(SMALL_TALK):
        records.append(
            {
                "subject": f"small talk {i}",
                "kind": "chat",
                "questions": questions,
                "answer": answer,
                "split": "train",
                "core": False,
            }
        )
    return records


# What users type first in a chat page; without these the model answers "Hi" with a docstring.
SMALL_TALK = [
    (
        ["Hello!", "Hi", "Hello, who are you?", "Who are you?", "What are you?"],
        "Hello! I am a small assistant for Python questions. Ask me about a statement, a built-in "
        "function or a standard-library module, and I will answer from the Python documentation.",
    ),
    (
        ["What can you do?", "How can you help me?", "What do you know about?"],
        "I answer short questions about Python: statements such as `for` and `with`, built-in "
        "functions and types, and common standard-library modules such as `os`, `json` and `re`.",
    ),
    (["Thank you!", "Thanks", "Thanks for your help."], "You are welcome! Ask me another Python question any time."),
]


def scenario_subjects(records, prompts):
    """Maps each scenario question to the record that has it as one of its phrasings."""
    by_question = {q: r["subject"] for r in records for q in r["questions"]}
    missing = [q for q in prompts["questions"] if q not in by_question]
    assert not missing, f"scenario questions with no training record: {missing}"
    return {q: by_question[q] for q in prompts["questions"]}


def records():
    """All records. The subjects of the scenario questions and of the tests are "core": never
    held out, and seen more often in training."""
    prompts = json.loads((ASSETS / "prompts.json").read_text())
    protected = set(scenario_subjects(build(), prompts).values()) | set(EXTRA_PROTECTED)
    return build(protected)


def main(out=None):
    recs = records()
    for split in ("train", "valid"):
        print(f"{sum(r['split'] == split for r in recs)} {split} subjects")
        if out:
            with open(Path(out) / f"{split}.jsonl", "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in recs if r["split"] == split)


# Subjects the tests ask about: never held out, so the tests probe the training set.
EXTRA_PROTECTED = ["str.join", "math.sqrt", "the `while` statement"]

if __name__ == "__main__":
    import sys

    main(sys.argv[1] if len(sys.argv) > 1 else None)
