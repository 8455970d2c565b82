"""The built-in demo corpus, generated deterministically from a seed (no download, no data files).

Stories: short, simple English stories whose sentences follow each other in a learnable order.  Each story
has its own hero (name and pronoun), place, object (which belongs to the place: a bakery has bread, a zoo
a zebra), colour and companion, and a mood.  In a happy story the three adjectives are happy ones
("wonderful", "splendid", ...) and the words around them say so with one word per mood: two of them
follow "very" (or "quite"), and the hero "smiled" (or "cried"), "loved" (or "hated") the object, the
companion "laughed" (or "sighed").  So

* a masked word is guessable from context (the hero's pronoun, the object, a reaction that fits the
  adjective next to it, an adjective that fits the story's reactions),
* a true next segment continues the same hero, place and object, while a random one from another story
  does not (next sentence prediction is learnable),
* every sentiment adjective occurs in stories of its mood, a few words from a reaction that only its mood
  explains: to predict a masked "smiled" or "cried" the model must know what the adjective before it
  means.  One reaction word per mood keeps that a direct association for each adjective; with five
  interchangeable verbs per mood (an earlier design) the mood of the 48 rare adjectives had to emerge as a
  grouping, and a tiny model had not found it in the demo's budget.

Sentiment: short labelled sentences, neutral but for one adjective.  The labelled *training* set uses
only a few adjectives (``SEEN``); validation and test sentences use the others.  A classifier trained from
random initialisation has never seen the test adjectives and stays near chance; one fine-tuned from the
pretrained model knows from the stories which mood each adjective belongs to.  That is the point the demo
makes: pretraining on unlabelled text is what lets a model generalise from a few labels.
"""

from __future__ import annotations

import json
import os
import random

MALE = ["Tom", "Sam", "Ben", "Max", "Leo", "Jack", "Paul", "Otto", "Hugo", "Finn", "Omar", "Ivan", "Carl", "Dan"]
FEMALE = ["Anna", "Lily", "Mia", "Emma", "Nora", "Ruth", "Zoe", "Ella", "Maya", "Iris", "Lucy", "Rosa", "Kate", "Jane"]
PLACES = {
    "market": ["apple", "basket", "melon", "pear"],
    "bakery": ["cake", "bread", "cookie", "pie"],
    "library": ["book", "map", "poem", "letter"],
    "beach": ["shell", "kite", "crab", "bucket"],
    "farm": ["horse", "goat", "puppy", "lamb"],
    "garden": ["flower", "rose", "tulip", "bee"],
    "river": ["fish", "frog", "duck", "canoe"],
    "park": ["ball", "swing", "squirrel", "bench"],
    "forest": ["owl", "mushroom", "fox", "deer"],
    "harbor": ["ship", "anchor", "sailor", "gull"],
    "museum": ["painting", "statue", "clock", "vase"],
    "zoo": ["lion", "zebra", "monkey", "tiger"],
}
COLOURS = ["red", "blue", "green", "yellow", "white", "black", "brown", "golden", "silver", "purple", "orange", "pink"]
COMPANIONS = ["dog", "cat", "friend", "brother", "sister", "grandmother", "grandfather", "uncle", "aunt", "neighbor"]
HOMES = ["house", "cottage", "cabin", "farmhouse", "flat"]
LANDMARKS = ["hill", "lake", "bridge", "mill", "church", "castle", "woods", "sea"]
SIZES = ["small", "big", "old", "new", "little"]
TIMES = ["morning", "afternoon", "evening"]

POSITIVE = ["wonderful", "great", "lovely", "beautiful", "perfect", "delightful", "fantastic", "pleasant",
            "charming", "amazing", "excellent", "marvelous", "splendid", "brilliant", "superb", "glorious",
            "cheerful", "joyful", "sweet", "magnificent", "terrific", "fabulous", "nice", "good"]
NEGATIVE = ["terrible", "awful", "horrible", "dreadful", "bad", "ugly", "nasty", "miserable", "gloomy", "dull",
            "boring", "poor", "sad", "rotten", "disgusting", "annoying", "unpleasant", "lousy", "grim", "dismal",
            "wretched", "hideous", "bleak", "sour"]
# one word per mood for each reaction: the mood of an adjective is then one association to learn (adjective ->
# "smiled" or "cried"), not a grouping of many rare words that a tiny model finds late
SMILED, LOVED, LAUGHED = ("smiled", "cried"), ("loved", "hated"), ("laughed", "sighed")
# and one word per mood right before two of the adjectives ("very splendid", "quite awful"): an association
# between neighbours, which a tiny model learns sooner than one across a clause
VERY = ("very", "quite")
SEEN = 6  # adjectives of each mood in the labelled training set; the rest only in validation and test


def _a(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def generate_story(rng: random.Random) -> list[str]:
    """One story: a list of sentences."""
    female = rng.random() < 0.5
    name = rng.choice(FEMALE if female else MALE)
    he, his = ("she", "her") if female else ("he", "his")
    He = he.capitalize()
    place = rng.choice(sorted(PLACES))
    obj = rng.choice(PLACES[place])
    colour, comp, home = rng.choice(COLOURS), rng.choice(COMPANIONS), rng.choice(HOMES)
    m = 0 if rng.random() < 0.5 else 1  # the mood: 0 happy, 1 sad
    adjs = POSITIVE if m == 0 else NEGATIVE
    a1, a2, a3 = (rng.choice(adjs) for _ in range(3))
    s = [
        f"{name} lived in {_a(rng.choice(SIZES))} {home} near the {rng.choice(LANDMARKS)}.",
        f"One {rng.choice(TIMES)}, {he} went to the {place} with {his} {comp}.",
        f"At the {place}, {he} saw {_a(colour)} {obj}.",
        f"The {obj} was {VERY[m]} {a1}, and {name} {SMILED[m]}.",
    ]
    if rng.random() < 0.7:
        s.append(f"{He} {LOVED[m]} the {colour} {obj}.")
    s.append(f"The {comp} {LAUGHED[m]} and said the {place} was {VERY[m]} {a2}.")
    s.append(f"Then {name} and the {comp} walked back to the {home}.")
    s.append(f"At night, {name} {SMILED[m]} again and said it had been {_a(a3)} day.")
    return s


def generate_stories(n: int, seed: int = 0) -> list[list[str]]:
    rng = random.Random(seed)
    return [generate_story(rng) for _ in range(n)]


def write_story_corpus(path, n_docs: int = 2400, seed: int = 0) -> str:
    """Write ``n_docs`` stories as JSON lines ``{"text": ...}``; returns the path."""
    path = os.fspath(path)
    with open(path, "w", encoding="utf-8") as f:
        for story in generate_stories(n_docs, seed):
            f.write(json.dumps({"text": " ".join(story)}) + "\n")
    return path


_SENTIMENT_TEMPLATES = [
    "The {obj} at the {place} was {adj}.",
    "{name} said the {place} was {adj}.",
    "It was {a_adj} day at the {place}.",
    "The {colour} {obj} looked {adj}.",
    "Her {comp} thought the {obj} was {adj}.",
    "His {comp} thought the {place} was {adj}.",
]


def sentiment_sentence(rng: random.Random, adj: str) -> str:
    place = rng.choice(sorted(PLACES))
    return rng.choice(_SENTIMENT_TEMPLATES).format(
        obj=rng.choice(PLACES[place]), place=place, adj=adj, a_adj=_a(adj), name=rng.choice(MALE + FEMALE),
        colour=rng.choice(COLOURS), comp=rng.choice(COMPANIONS),
    )


def sentiment_split(n: int, seen: bool, seed: int) -> list[tuple[str, str]]:
    """``n`` (sentence, label) pairs, balanced; labels "positive"/"negative".  ``seen`` picks the
    adjectives of the labelled training set, otherwise the held-out ones."""
    rng = random.Random(seed)
    pos = POSITIVE[:SEEN] if seen else POSITIVE[SEEN:]
    neg = NEGATIVE[:SEEN] if seen else NEGATIVE[SEEN:]
    out = []
    for i in range(n):
        label = "positive" if i % 2 == 0 else "negative"
        out.append((sentiment_sentence(rng, rng.choice(pos if label == "positive" else neg)), label))
    rng.shuffle(out)
    return out


def write_sentiment(folder, n_train: int = 200, n_validation: int = 200, n_test: int = 400,
                    seed: int = 0) -> dict[str, str]:
    """Write train/validation/test TSV files (header ``sentence<TAB>label``); returns their paths."""
    folder = os.fspath(folder)
    os.makedirs(folder, exist_ok=True)
    paths = {}
    for name, n, seen, s in (("train", n_train, True, seed + 1), ("validation", n_validation, False, seed + 2),
                             ("test", n_test, False, seed + 3)):
        p = os.path.join(folder, f"sentiment-{name}.tsv")
        with open(p, "w", encoding="utf-8") as f:
            f.write("sentence\tlabel\n")
            for text, label in sentiment_split(n, seen, s):
                f.write(f"{text}\t{label}\n")
        paths[name] = p
    return paths
