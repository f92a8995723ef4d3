"""benchmarks/real_corpus.py: reading .mo and .qm catalogues, cleaning pairs, splitting.

Small catalogues are written here in memory; nothing is downloaded.
"""

import importlib.util
import os
import struct

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def rc():
    path = os.path.join(ROOT, "benchmarks", "real_corpus.py")
    spec = importlib.util.spec_from_file_location("real_corpus", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make_mo(entries: dict[bytes, bytes], order: str = "<") -> bytes:
    """A .mo file as msgfmt writes it: header, two offset tables, then the strings."""
    keys = sorted(entries)
    ids_at, strs_at = 28, 28 + 8 * len(keys)
    data_at = strs_at + 8 * len(keys)
    blob, ids, strs = b"", [], []
    for table, texts in ((ids, keys), (strs, [entries[k] for k in keys])):
        for text in texts:
            table.append((len(text), data_at + len(blob)))
            blob += text + b"\x00"
    head = struct.pack(order + "7I", 0x950412DE, 0, len(keys), ids_at, strs_at, 0, 0)
    tables = b"".join(struct.pack(order + "2I", *e) for e in ids + strs)
    return head + tables + blob


def qm_field(tag: int, value: bytes) -> bytes:
    return bytes([tag]) + struct.pack(">I", len(value)) + value


def make_qm(messages: list[tuple[str, list[str]]]) -> bytes:
    block = b""
    for source, translations in messages:
        block += qm_field(7, b"Dialog")  # context
        block += b"".join(qm_field(3, t.encode("utf-16-be")) for t in translations)
        block += qm_field(6, source.encode()) + bytes([5]) + b"\x00\x00\x00\x2a" + bytes([1])
    hashes = bytes([0x42]) + struct.pack(">I", 8) + b"\x00" * 8  # a block the reader skips
    return (
        bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")
        + hashes
        + bytes([0x69])
        + struct.pack(">I", len(block))
        + block
    )


HEADER = b"Content-Type: text/plain; charset=UTF-8\n"


@pytest.mark.parametrize("order", ["<", ">"])
def test_parse_mo_drops_header_and_context_and_takes_the_singular(rc, order):
    mo = make_mo(
        {
            b"": HEADER,
            b"Open": b"Ouvrir",
            b"menu\x04File": b"Fichier",
            b"%d file\x00%d files": b"%d fichier\x00%d fichiers",
        },
        order,
    )
    assert sorted(rc.parse_mo(mo)) == [
        ("%d file", "%d fichier"),
        ("File", "Fichier"),
        ("Open", "Ouvrir"),
    ]


def test_parse_mo_decodes_the_declared_charset(rc):
    mo = make_mo({b"": b"Content-Type: text/plain; charset=ISO-8859-1\n", b"Yes": b"Oui \xe9"})
    assert list(rc.parse_mo(mo)) == [("Yes", "Oui é")]
    with pytest.raises(ValueError):
        list(rc.parse_mo(b"not a catalogue at all....."))


def test_parse_qm_reads_sources_and_first_plural_form(rc):
    qm = make_qm([("&Open", ["&Ouvrir"]), ("%n file(s)", ["%n fichier", "%n fichiers"])])
    assert list(rc.parse_qm(qm)) == [("&Open", "&Ouvrir"), ("%n file(s)", "%n fichier")]
    untranslated = make_qm([("Close", [])])
    assert list(rc.parse_qm(untranslated)) == []


@pytest.mark.parametrize(
    "path, expected",
    [
        ("usr/share/locale/fr/LC_MESSAGES/gimp20.mo", True),
        ("usr/share/wordpress/wp-content/languages/admin-fr_FR.mo", True),
        ("usr/share/qt5/translations/qtbase_fr.qm", True),
        ("usr/share/stellarium/translations/stellarium/fr.qm", True),
        ("usr/share/locale/fr_CA/LC_MESSAGES/gimp20.mo", False),
        ("usr/share/locale/fy/LC_MESSAGES/gimp20.mo", False),
        ("usr/share/locale/fr/LC_MESSAGES/README", False),
        ("usr/share/games/frozen/fr.png", False),
    ],
)
def test_is_catalogue(rc, path, expected):
    assert rc.is_catalogue(path, "fr") is expected


NORMALIZED = [  # (source, target) -> (source, target)
    (("_Open", "_Ouvrir"), ("Open", "Ouvrir")),  # GTK
    (("Assigned &to:", "A&ssocié à :"), ("Assigned to:", "Associé à :")),  # Qt, KDE
    (("Perform &Auto-Type", "Saisir"), ("Perform Auto-Type", "Saisir")),
    (("E~xit", "~Quitter"), ("Exit", "Quitter")),  # LibreOffice
    (("Canc^el actions", "Annu^ler les actions"), ("Cancel actions", "Annuler les actions")),
    (("Search ^Backwards", "Chercher en ^arrière"), ("Search Backwards", "Chercher en arrière")),
    (("race+female^Dwarf", "Naine"), ("Dwarf", "Naine")),  # Wesnoth's context
    (("Action|Open", "Ouvrir"), ("Open", "Ouvrir")),  # GTK's Q_() context
    (("inflections||May", "mai"), ("May", "mai")),  # Gramps
    (("|pinentry-label|_OK", "|pinentry-label|_Valider"), ("OK", "Valider")),  # GnuPG
    (("?pollution [short]:Pol", "Pol"), ("Pol", "Pol")),  # freeciv
    (("dynamic[[Quotes]]", "dynamiques"), ("dynamic", "dynamiques")),  # LyX's context
    (("Disable Editing|E", "Inhiber|h"), ("Disable Editing", "Inhiber")),  # LyX's shortcut
    (("Use -u|-i", "Utiliser -u|-i"), ("Use -u|-i", "Utiliser -u|-i")),  # not a context
    (("<p>Hello<br/>World</p>", "<p>Bonjour<br/>monde</p>"), ("Hello World", "Bonjour monde")),
    (("Save &amp; <b>Close</b>", "Garder &amp; fermer"), ("Save & Close", "Garder & fermer")),
    (("Usage: %s <file>", "Usage : %s <fichier>"), ("Usage: %s <file>", "Usage : %s <fichier>")),
    (("bad %<__builtin_tgmath%>", "mauvais %<__builtin_tgmath%>"),) * 2,  # no mark in code
    (("a__b_c and x_y", "a__b_c et x_y"), ("a__b_c and xy", "a__b_c et xy")),
    (("One\nline\ttwo", "Un\n ligne\u00a0deux"), ("One line two", "Un ligne deux")),
]


@pytest.mark.parametrize("pair, expected", NORMALIZED)
def test_normalize_pair(rc, pair, expected):
    assert rc.normalize_pair(*pair) == expected


@pytest.mark.parametrize(
    "source, target, reason",
    [
        ("Open", "", "untranslated"),
        ("translator-credits", "Jean Dupont", "credits or bad bytes"),
        ("Bad \ufffd byte", "Mauvais octet", "credits or bad bytes"),
        ("%s: %s", "%s : %s", "no words"),
        ("%1 (%2)", "%1 (%2)", "no words"),
        ("$(ARG1)", "$(ARG1)", "no words"),
        ("200%", "200 %", "no words"),
        ("STR_FILE_OPEN", "Ouvrir", "identifier"),
        ("/usr/share/doc", "/usr/share/doc", "identifier"),
        ("ClearInstrsBigChanges", "Supprimer les instructions", "identifier"),
        ("red|green|blue|black", "rouge|vert|bleu|noir", "list"),
        ("word " * 201, "mot " * 201, "too long"),
        ("Description", "description", "same as source"),
        ("Open the file", "Ouvrir le fichier", None),
        ("Open %s", "Ouvrir %s", None),
        ("OK", "Valider", None),
    ],
)
def test_why_dropped(rc, source, target, reason):
    source, target = " ".join(source.split()), " ".join(target.split())
    assert rc.why_dropped(source, target) == reason
    assert (rc.clean_pair(source, target) is None) is (reason is not None)


def test_dedup_key_ignores_case_punctuation_and_spacing(rc):
    assert rc.dedup_key("Open File...") == rc.dedup_key("open  file") == "open file"
    assert rc.dedup_key("Open File") != rc.dedup_key("Open Files")


def test_split_is_deterministic_disjoint_and_keeps_order(rc):
    pairs = [(f"sentence number {i}", f"phrase numéro {i}") for i in range(50)]
    splits = rc.split_pairs(pairs, held_out=5)
    assert {k: len(v) for k, v in splits.items()} == {"train": 40, "dev": 5, "test": 5}
    assert splits == rc.split_pairs(list(pairs), held_out=5)
    keys = {name: {rc.dedup_key(s) for s, _ in split} for name, split in splits.items()}
    assert not (
        keys["train"] & keys["dev"] or keys["train"] & keys["test"] or keys["dev"] & keys["test"]
    )
    for split in splits.values():
        assert split == sorted(split, key=pairs.index)
    # a sentence's split does not depend on the other sentences
    fewer = rc.split_pairs(pairs[:25] + pairs[26:], held_out=5)
    assert set(fewer["test"]) <= set(splits["test"]) | set(splits["dev"])


def test_write_splits_writes_aligned_files(rc, tmp_path):
    splits = {
        "train": [("Open", "Ouvrir"), ("Close", "Fermer")],
        "dev": [("Yes", "Oui")],
        "test": [],
    }
    rc.write_splits(str(tmp_path), splits, "en", "fr")
    assert (tmp_path / "train.en").read_text(encoding="utf-8") == "Open\nClose\n"
    assert (tmp_path / "train.fr").read_text(encoding="utf-8") == "Ouvrir\nFermer\n"
    assert (tmp_path / "dev.fr").read_text(encoding="utf-8") == "Oui\n"
    assert (tmp_path / "test.en").read_text(encoding="utf-8") == ""


def test_licenses_from_machine_readable_and_prose_copyright(rc):
    dep5 = "Files: *\nLicense: MPL-2.0\n\nFiles: x\nLicense: GPL-2+\n text\nLicense: MPL-2.0\n"
    assert rc.licenses(dep5) == ["MPL-2.0", "GPL-2+"]
    prose = (
        "under the terms of the GNU General Public License as published by the Free Software\n"
        "Foundation; either version 2 of the License, or (at your option) any later version."
    )
    assert rc.licenses(prose) == ["GPL-2+"]
    assert rc.licenses(None) == []
