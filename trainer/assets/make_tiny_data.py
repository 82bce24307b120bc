"""Generate the tiny example's data: the tokenizer corpus and the bundled alpaca dataset.

Run from the repository root (the output is committed; rerun only when the templates change, then the
tiny model's recipe hash changes with the corpus and every cache rebuilds it):

    .venv/bin/python trainer/assets/make_tiny_data.py

Both files come from the same word lists and templates, so the tokenizer's merges fit the dataset. The
output is a pure function of this file: `tests/unit/test_tiny.py` regenerates it and compares bytes.
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Callable
from pathlib import Path

from trainer.data import alpaca_prompt

Example = tuple[str, str, str]  # instruction, input, output

CAPITALS = {
    "France": "Paris", "Spain": "Madrid", "Italy": "Rome", "Germany": "Berlin", "Japan": "Tokyo",
    "Egypt": "Cairo", "Peru": "Lima", "Kenya": "Nairobi", "Canada": "Ottawa", "Chile": "Santiago",
    "Greece": "Athens", "Norway": "Oslo", "Sweden": "Stockholm", "Poland": "Warsaw", "Cuba": "Havana",
    "Ireland": "Dublin", "Austria": "Vienna", "Portugal": "Lisbon", "Russia": "Moscow", "China": "Beijing",
    "India": "Delhi", "Mexico": "Mexico City", "Brazil": "Brasilia", "Turkey": "Ankara",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Hungary": "Budapest", "Ghana": "Accra",
    "Nepal": "Kathmandu", "Iran": "Tehran",
}  # fmt: skip
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "light": "dark", "early": "late",
    "high": "low", "open": "closed", "full": "empty", "hard": "soft", "young": "old", "rich": "poor",
    "strong": "weak", "wet": "dry", "loud": "quiet", "long": "short", "thick": "thin", "clean": "dirty",
    "near": "far", "up": "down", "in": "out", "left": "right", "first": "last", "good": "bad",
    "heavy": "light", "sweet": "sour", "wide": "narrow", "deep": "shallow", "true": "false", "new": "old",
}  # fmt: skip
SOUNDS = {
    "dog": "woof", "cat": "meow", "cow": "moo", "duck": "quack", "sheep": "baa", "lion": "roar",
    "owl": "hoot", "pig": "oink", "horse": "neigh", "bee": "buzz", "frog": "croak", "mouse": "squeak",
    "snake": "hiss", "crow": "caw", "goat": "bleat", "wolf": "howl",
}  # fmt: skip
COLORS = {
    "grass": "green", "snow": "white", "the sky": "blue", "coal": "black", "a banana": "yellow",
    "a tomato": "red", "an orange": "orange", "a lemon": "yellow", "milk": "white", "a leaf": "green",
    "blood": "red", "the sea": "blue", "chocolate": "brown", "a carrot": "orange", "a plum": "purple",
    "ink": "black", "a cherry": "red", "wood": "brown", "a cloud": "white", "a lime": "green",
}  # fmt: skip
PLURALS = {
    "cat": "cats", "box": "boxes", "child": "children", "mouse": "mice", "city": "cities",
    "knife": "knives", "man": "men", "woman": "women", "tooth": "teeth", "foot": "feet", "bus": "buses",
    "baby": "babies", "leaf": "leaves", "goose": "geese", "dog": "dogs", "book": "books",
    "church": "churches", "story": "stories", "wolf": "wolves", "fish": "fish", "sheep": "sheep",
    "person": "people", "glass": "glasses", "party": "parties",
}  # fmt: skip
UNITS = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve",
    "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen", "nineteen",
]  # fmt: skip
TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
THINGS = ["movie", "book", "song", "game", "meal", "phone", "city", "team", "show", "car", "class", "park"]
LIKES = ["I love this {t}.", "What a great {t}!", "This {t} is wonderful.", "I really enjoyed the {t}."]
DISLIKES = ["I hate this {t}.", "What a terrible {t}!", "This {t} is awful.", "I really disliked the {t}."]


def number_words(n: int) -> str:
    """English words for 0 <= n < 100."""
    if n < 20:
        return UNITS[n]
    tens, unit = divmod(n, 10)
    return TENS[tens] if unit == 0 else f"{TENS[tens]}-{UNITS[unit]}"


def capital(rng: random.Random) -> Example:
    country = rng.choice(sorted(CAPITALS))
    ask = rng.choice(
        ["What is the capital of {c}?", "Name the capital city of {c}.", "Which city is the capital of {c}?"]
    )
    return ask.format(c=country), "", f"The capital of {country} is {CAPITALS[country]}."


def opposite(rng: random.Random) -> Example:
    word = rng.choice(sorted(OPPOSITES))
    ask = rng.choice(
        ["Give the opposite of the word.", "What is the opposite of this word?", "Write an antonym."]
    )
    return ask, word, f"The opposite of {word} is {OPPOSITES[word]}."


def sound(rng: random.Random) -> Example:
    animal = rng.choice(sorted(SOUNDS))
    ask = rng.choice(["What sound does a {a} make?", "How does a {a} sound?", "Name the sound of a {a}."])
    return ask.format(a=animal), "", f"A {animal} says {SOUNDS[animal]}."


def color(rng: random.Random) -> Example:
    thing = rng.choice(sorted(COLORS))
    ask = rng.choice(["What color is {t}?", "Name the color of {t}.", "Tell me the usual color of {t}."])
    return ask.format(t=thing), "", f"The color of {thing} is {COLORS[thing]}."


def plural(rng: random.Random) -> Example:
    noun = rng.choice(sorted(PLURALS))
    ask = rng.choice(
        ["Write the plural of the noun.", "What is the plural form of this word?", "Make it plural."]
    )
    return ask, noun, f"The plural of {noun} is {PLURALS[noun]}."


def add(rng: random.Random) -> Example:
    a, b = rng.randint(0, 49), rng.randint(0, 49)
    ask = rng.choice(["Add the two numbers.", "What is the sum of these numbers?", "Compute the sum."])
    return ask, f"{a} and {b}", f"{a} plus {b} is {a + b}."


def count(rng: random.Random) -> Example:
    start = rng.randint(0, 90)
    ask = rng.choice(["Count up from {n} by one, four numbers.", "List four numbers starting at {n}."])
    return ask.format(n=start), "", ", ".join(str(start + i) for i in range(4)) + "."


def spell(rng: random.Random) -> Example:
    n = rng.randint(0, 99)
    ask = rng.choice(["Write the number in words.", "Spell out this number.", "How is this number written?"])
    return ask, str(n), f"{n} is written {number_words(n)}."


def sentiment(rng: random.Random) -> Example:
    thing, positive = rng.choice(THINGS), rng.random() < 0.5
    text = rng.choice(LIKES if positive else DISLIKES).format(t=thing)
    ask = rng.choice(["Classify the sentiment of the sentence.", "Is this sentence positive or negative?"])
    return ask, text, f"The sentiment is {'positive' if positive else 'negative'}."


def reverse(rng: random.Random) -> Example:
    words = rng.sample(sorted({*SOUNDS, *THINGS}), 3)
    ask = rng.choice(["Reverse the order of the list.", "Write the list backwards."])
    return ask, ", ".join(words), ", ".join(reversed(words)) + "."


TASKS: list[Callable[[random.Random], Example]] = [
    capital, opposite, sound, color, plural, add, count, spell, sentiment, reverse,
]  # fmt: skip


def examples(count_: int, seed: int, *, unique: bool = False) -> list[Example]:
    """`count_` examples from the tasks in turn, drawn with a fixed seed; `unique` skips repeats."""
    rng = random.Random(seed)
    out: list[Example] = []
    seen: set[Example] = set()
    i = 0
    while len(out) < count_:
        example = TASKS[i % len(TASKS)](rng)
        i += 1
        if unique and example in seen:
            continue
        seen.add(example)
        out.append(example)
    return out


def corpus(count_: int, seed: int) -> str:
    """Tokenizer training text: alpaca-formatted examples (a different draw from the dataset's)."""
    parts = []
    for instruction, input_, output in examples(count_, seed):
        parts.append(alpaca_prompt(instruction, input_) + output + "\n\n")
    return "".join(parts)


def write(repo_root: Path) -> list[Path]:
    """Write both files under `repo_root`; return their paths."""
    data = repo_root / "configs" / "examples" / "data" / "tiny-alpaca.jsonl"
    text = repo_root / "trainer" / "assets" / "tiny-corpus.txt"
    data.parent.mkdir(parents=True, exist_ok=True)
    text.parent.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"instruction": i, "input": x, "output": o}, ensure_ascii=False) + "\n"
        for i, x, o in examples(800, seed=1234, unique=True)
    ]
    data.write_text("".join(lines), encoding="utf-8")
    text.write_text(corpus(600, seed=4321), encoding="utf-8")
    return [data, text]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    root = Path(__file__).resolve().parents[2]
    parser.add_argument("--root", type=Path, default=root, help="repository root")
    for path in write(parser.parse_args().root):
        print(f"wrote {path} ({path.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
