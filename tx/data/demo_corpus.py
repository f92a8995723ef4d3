"""The built-in offline demo corpus: English -> German in miniature, generated from a seed.

Not a toy copy task: each sentence needs a piece of German grammar that English does not show.
  * numbers as words, units before tens: "two hundred forty-two" -> "zweihundertzweiundvierzig";
    years: "nineteen ninety-four" -> "neunzehnhundertvierundneunzig"
  * noun phrases whose article and adjective endings agree in gender, case and number:
    "a small red car" -> "ein kleines rotes Auto" (nom.) / "mit einem kleinen roten Auto" (dat.)
  * dates with dative ordinals: "on the third of May" -> "am dritten Mai"
  * word order: verb second after a fronted time ("Am dritten Mai sieht der Mann ..."), the
    participle at the end in the perfect ("hat ... gesehen") and the verb last in a "dass" clause.
About 450 word forms plus about 1,230 number, ordinal and year words. Splits are disjoint by
construction: a sentence's split is a hash of its English side, and duplicates are dropped.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator

from num2words import num2words

VERSION = 1  # bump when the generator changes: it is part of the token-cache fingerprint

# English singular, English plural, German singular, German plural, gender (m / f / n).
NOUNS = [
    ("dog", "dogs", "Hund", "Hunde", "m"),
    ("man", "men", "Mann", "Männer", "m"),
    ("table", "tables", "Tisch", "Tische", "m"),
    ("chair", "chairs", "Stuhl", "Stühle", "m"),
    ("tree", "trees", "Baum", "Bäume", "m"),
    ("apple", "apples", "Apfel", "Äpfel", "m"),
    ("letter", "letters", "Brief", "Briefe", "m"),
    ("bird", "birds", "Vogel", "Vögel", "m"),
    ("teacher", "teachers", "Lehrer", "Lehrer", "m"),
    ("friend", "friends", "Freund", "Freunde", "m"),
    ("key", "keys", "Schlüssel", "Schlüssel", "m"),
    ("garden", "gardens", "Garten", "Gärten", "m"),
    ("train", "trains", "Zug", "Züge", "m"),
    ("hat", "hats", "Hut", "Hüte", "m"),
    ("cat", "cats", "Katze", "Katzen", "f"),
    ("woman", "women", "Frau", "Frauen", "f"),
    ("flower", "flowers", "Blume", "Blumen", "f"),
    ("door", "doors", "Tür", "Türen", "f"),
    ("lamp", "lamps", "Lampe", "Lampen", "f"),
    ("bag", "bags", "Tasche", "Taschen", "f"),
    ("city", "cities", "Stadt", "Städte", "f"),
    ("street", "streets", "Straße", "Straßen", "f"),
    ("clock", "clocks", "Uhr", "Uhren", "f"),
    ("bottle", "bottles", "Flasche", "Flaschen", "f"),
    ("cow", "cows", "Kuh", "Kühe", "f"),
    ("mouse", "mice", "Maus", "Mäuse", "f"),
    ("sister", "sisters", "Schwester", "Schwestern", "f"),
    ("house", "houses", "Haus", "Häuser", "n"),
    ("car", "cars", "Auto", "Autos", "n"),
    ("book", "books", "Buch", "Bücher", "n"),
    ("child", "children", "Kind", "Kinder", "n"),
    ("horse", "horses", "Pferd", "Pferde", "n"),
    ("window", "windows", "Fenster", "Fenster", "n"),
    ("picture", "pictures", "Bild", "Bilder", "n"),
    ("boat", "boats", "Boot", "Boote", "n"),
    ("ship", "ships", "Schiff", "Schiffe", "n"),
    ("glass", "glasses", "Glas", "Gläser", "n"),
    ("shirt", "shirts", "Hemd", "Hemden", "n"),
    ("egg", "eggs", "Ei", "Eier", "n"),
]
ANIMATE = {
    "dog",
    "man",
    "bird",
    "teacher",
    "friend",
    "cat",
    "woman",
    "cow",
    "mouse",
    "sister",
    "child",
    "horse",
}

# English, German stem; English order: opinion/size/age before colour (two at most).
ADJECTIVES = [
    ("small", "klein"),
    ("big", "groß"),
    ("old", "alt"),
    ("new", "neu"),
    ("young", "jung"),
    ("beautiful", "schön"),
    ("cheap", "billig"),
    ("fast", "schnell"),
    ("cold", "kalt"),
    ("warm", "warm"),
    ("red", "rot"),
    ("green", "grün"),
    ("blue", "blau"),
    ("black", "schwarz"),
    ("white", "weiß"),
    ("yellow", "gelb"),
]
COLOURS = {"red", "green", "blue", "black", "white", "yellow"}

# English: base, 3rd singular, simple past, participle; German: ich, er/sie/es, wir/sie, participle.
VERBS = [
    ("see", "sees", "saw", "seen", "sehe", "sieht", "sehen", "gesehen"),
    ("buy", "buys", "bought", "bought", "kaufe", "kauft", "kaufen", "gekauft"),
    ("sell", "sells", "sold", "sold", "verkaufe", "verkauft", "verkaufen", "verkauft"),
    ("find", "finds", "found", "found", "finde", "findet", "finden", "gefunden"),
    ("need", "needs", "needed", "needed", "brauche", "braucht", "brauchen", "gebraucht"),
    ("paint", "paints", "painted", "painted", "male", "malt", "malen", "gemalt"),
    ("wash", "washes", "washed", "washed", "wasche", "wäscht", "waschen", "gewaschen"),
    ("carry", "carries", "carried", "carried", "trage", "trägt", "tragen", "getragen"),
    ("love", "loves", "loved", "loved", "liebe", "liebt", "lieben", "geliebt"),
    ("draw", "draws", "drew", "drawn", "zeichne", "zeichnet", "zeichnen", "gezeichnet"),
    ("hold", "holds", "held", "held", "halte", "hält", "halten", "gehalten"),
    ("count", "counts", "counted", "counted", "zähle", "zählt", "zählen", "gezählt"),
    ("catch", "catches", "caught", "caught", "fange", "fängt", "fangen", "gefangen"),
    ("build", "builds", "built", "built", "baue", "baut", "bauen", "gebaut"),
    ("bring", "brings", "brought", "brought", "bringe", "bringt", "bringen", "gebracht"),
    ("take", "takes", "took", "taken", "nehme", "nimmt", "nehmen", "genommen"),
]
HAVE = {"1sg": "habe", "3sg": "hat", "pl": "haben"}

PRONOUNS = [
    ("I", "ich", "1sg"),
    ("he", "er", "3sg"),
    ("she", "sie", "3sg"),
    ("we", "wir", "pl"),
    ("they", "sie", "pl"),
]

MONTHS = [
    ("January", "Januar"),
    ("February", "Februar"),
    ("March", "März"),
    ("April", "April"),
    ("May", "Mai"),
    ("June", "Juni"),
    ("July", "Juli"),
    ("August", "August"),
    ("September", "September"),
    ("October", "Oktober"),
    ("November", "November"),
    ("December", "Dezember"),
]

REPORTERS = [
    ("I know", "ich weiß"),
    ("she says", "sie sagt"),
    ("we believe", "wir glauben"),
    ("he thinks", "er denkt"),
    ("they hope", "sie hoffen"),
]

DEFINITE = {
    "nom": {"m": "der", "f": "die", "n": "das", "pl": "die"},
    "acc": {"m": "den", "f": "die", "n": "das", "pl": "die"},
    "dat": {"m": "dem", "f": "der", "n": "dem", "pl": "den"},
}
INDEFINITE = {
    "nom": {"m": "ein", "f": "eine", "n": "ein"},
    "acc": {"m": "einen", "f": "eine", "n": "ein"},
    "dat": {"m": "einem", "f": "einer", "n": "einem"},
}
MY = {case: {g: "m" + art for g, art in forms.items()} for case, forms in INDEFINITE.items()}
MY_PLURAL = {"nom": "meine", "acc": "meine", "dat": "meinen"}


def _en_number(n: int) -> str:
    return num2words(n).replace(" and", "").replace(",", "")


def _de_number(n: int) -> str:
    return num2words(n, lang="de")


# Counted nouns take 2..999, skipping x01 ("hunderteins Hunde" is not idiomatic).
_COUNTS = [n for n in range(2, 1000) if n % 100 != 1]
_NUM_EN = {n: _en_number(n) for n in _COUNTS}
_NUM_DE = {n: _de_number(n) for n in _COUNTS}
_YEARS = {
    y: (num2words(y, to="year"), num2words(y, lang="de", to="year")) for y in range(1900, 2031)
}
_ORD_EN = {d: num2words(d, to="ordinal") for d in range(1, 32)}
_ORD_DE_DAT = {d: num2words(d, lang="de", to="ordinal") + "n" for d in range(1, 32)}


def _adjective_ending(det: str, case: str, gender: str) -> str:
    """German adjective ending after a determiner kind: def (weak), indef/my (mixed), none."""
    if gender == "pl":
        return "en" if det != "none" or case == "dat" else "e"
    if det == "def":
        return "e" if case == "nom" or (case == "acc" and gender != "m") else "en"
    # ein / mein: the adjective carries the gender where the article cannot.
    if case == "dat":
        return "en"
    if gender == "m":
        return "er" if case == "nom" else "en"
    return "e" if gender == "f" else "es"


def _noun_phrase(rng: random.Random, case: str, noun=None) -> tuple[str, str, str]:
    """Returns (English, German, person) for a noun phrase in `case`."""
    en_sg, en_pl, de_sg, de_pl, gender = noun or rng.choice(NOUNS)
    adjs = _pick_adjectives(rng)
    kind = rng.choice(["def", "indef", "my", "count", "def_pl", "my_pl"])
    plural = kind in ("count", "def_pl", "my_pl")
    g = "pl" if plural else gender
    det_kind = {
        "def": "def",
        "def_pl": "def",
        "indef": "indef",
        "my": "indef",
        "my_pl": "def",
        "count": "none",
    }[kind]
    ending = _adjective_ending(det_kind, case, g)
    de_adjs = [stem + ending for _, stem in adjs]
    en_adjs = [en for en, _ in adjs]
    if plural:
        noun_de = de_pl + ("n" if case == "dat" and not de_pl.endswith(("n", "s")) else "")
        noun_en = en_pl
    else:
        noun_de, noun_en = de_sg, en_sg
    if kind == "count":
        n = rng.choice(_COUNTS)
        en_det, de_det = _NUM_EN[n], _NUM_DE[n]
    elif kind in ("def", "def_pl"):
        en_det, de_det = "the", DEFINITE[case][g]
    elif kind == "indef":
        first = (en_adjs or [noun_en])[0]
        en_det, de_det = ("an" if first[0] in "aeiou" else "a"), INDEFINITE[case][gender]
    elif kind == "my":
        en_det, de_det = "my", MY[case][gender]
    else:
        en_det, de_det = "my", MY_PLURAL[case]
    en = " ".join([en_det, *en_adjs, noun_en])
    de = " ".join([de_det, *de_adjs, noun_de])
    return en, de, "pl" if plural else "3sg"


def _pick_adjectives(rng: random.Random) -> list[tuple[str, str]]:
    """None, one, or a quality and a colour (in that order, as both languages put them)."""
    k = rng.choice([0, 1, 1, 2])
    if k < 2:
        return rng.sample(ADJECTIVES, k)
    quality = rng.choice([a for a in ADJECTIVES if a[0] not in COLOURS])
    return [quality, rng.choice([a for a in ADJECTIVES if a[0] in COLOURS])]


def _subject(rng: random.Random) -> tuple[str, str, str]:
    if rng.random() < 0.35:
        return rng.choice(PRONOUNS)
    animate = [n for n in NOUNS if n[0] in ANIMATE]
    return _noun_phrase(rng, "nom", rng.choice(animate))


def _en_verb(verb, person: str, tense: str) -> str:
    base, third, past, _ = verb[:4]
    if tense == "past":
        return past
    return third if person == "3sg" else base


def _de_finite(verb, person: str) -> str:
    return {"1sg": verb[4], "3sg": verb[5], "pl": verb[6]}[person]


def _time_phrase(rng: random.Random) -> tuple[str, str]:
    r = rng.random()
    if r < 0.45:
        d, (m_en, m_de) = rng.randint(1, 31), rng.choice(MONTHS)
        return f"on the {_ORD_EN[d]} of {m_en}", f"am {_ORD_DE_DAT[d]} {m_de}"
    if r < 0.7:
        y = rng.randint(1900, 2030)
        return f"in {_YEARS[y][0]}", f"im Jahr {_YEARS[y][1]}"
    if r < 0.85:
        d, (m_en, m_de) = rng.randint(1, 31), rng.choice(MONTHS)
        return f"on {m_en} {d}", f"am {d}. {m_de}"
    return rng.choice([("today", "heute"), ("tomorrow", "morgen"), ("now", "jetzt")])


def _clause(rng: random.Random):
    """The parts of one transitive clause, shared by all sentence shapes."""
    subj_en, subj_de, person = _subject(rng)
    obj_en, obj_de, _ = _noun_phrase(rng, "acc")
    extra_en = extra_de = ""
    if rng.random() < 0.35:
        prep_en, prep_de = rng.choice([("with", "mit"), ("from", "von")])
        np_en, np_de, _ = _noun_phrase(rng, "dat")
        extra_en, extra_de = f" {prep_en} {np_en}", f" {prep_de} {np_de}"
    return subj_en, subj_de, person, obj_en + extra_en, obj_de + extra_de, rng.choice(VERBS)


def _sentence(rng: random.Random) -> tuple[str, str]:
    subj_en, subj_de, person, obj_en, obj_de, verb = _clause(rng)
    shape = rng.random()
    if shape < 0.3:  # plain present: S V O
        en = f"{subj_en} {_en_verb(verb, person, 'present')} {obj_en}"
        de = f"{subj_de} {_de_finite(verb, person)} {obj_de}"
    elif shape < 0.55:  # fronted time: the German verb stays second, the subject follows it
        t_en, t_de = _time_phrase(rng)
        en = f"{t_en}, {subj_en} {_en_verb(verb, person, 'present')} {obj_en}"
        de = f"{t_de} {_de_finite(verb, person)} {subj_de} {obj_de}"
    elif shape < 0.75:  # English simple past -> German perfect, participle last
        lead = rng.random() < 0.5
        en = f"{'yesterday ' if lead else ''}{subj_en} {_en_verb(verb, person, 'past')} {obj_en}"
        if lead:
            de = f"gestern {HAVE[person]} {subj_de} {obj_de} {verb[7]}"
        else:
            de = f"{subj_de} {HAVE[person]} {obj_de} {verb[7]}"
    else:  # reported clause: the German verb goes last
        r_en, r_de = rng.choice(REPORTERS)
        past = rng.random() < 0.4
        v_en = _en_verb(verb, person, "past" if past else "present")
        v_de = f"{verb[7]} {HAVE[person]}" if past else _de_finite(verb, person)
        en = f"{r_en} that {subj_en} {v_en} {obj_en}"
        de = f"{r_de}, dass {subj_de} {obj_de} {v_de}"
    return _finish(en), _finish(de)


def _finish(s: str) -> str:
    return s[0].upper() + s[1:] + "."


def split_of(english: str) -> str:
    """The split a sentence belongs to, from a hash of its English side (disjoint splits)."""
    h = int.from_bytes(hashlib.blake2b(english.encode(), digest_size=8).digest(), "big") % 100
    return "test" if h == 0 else "dev" if h == 1 else "train"


def generate(split: str, seed: int, size: int) -> Iterator[tuple[str, str]]:
    """The first `size` distinct pairs of `split` from the generator seeded with `seed`.

    The same (seed, size) always yields the same pairs in the same order.
    """
    if split not in ("train", "dev", "test"):
        raise ValueError(f"unknown demo split {split!r}")
    rng = random.Random(seed)
    seen: set[str] = set()
    produced, attempts = 0, 0
    while produced < size:
        attempts += 1
        if attempts > 200 * size + 10_000:
            raise RuntimeError(f"demo corpus: cannot find {size} distinct {split} sentences")
        en, de = _sentence(rng)
        if en in seen or split_of(en) != split:
            continue
        seen.add(en)
        produced += 1
        yield en, de
