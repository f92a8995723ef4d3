"""A real English-French, -Spanish or -Dutch parallel corpus from the catalogues Debian ships.

    python benchmarks/real_corpus.py --out /tmp/corpus-enfr [--pair en-fr|en-es|en-nl] \
        [--cache DIR]

On a 2-core machine: 3 minutes the first time (1.2 GB of .debs downloaded), 75-90 s from the
cache. en-fr gives 228,688 train, 1,000 dev and 1,000 test pairs from Debian 12 as served in
December 2026 (newer package versions move the counts a little; SOURCES.json names the .debs);
en-nl 177,847 train pairs, into a language that writes its compounds as one word, as German
does ("laaggroep", "attributenformulier").

What it builds: <out>/{train,dev,test}.{en,fr}, line-aligned UTF-8 text, one segment a line, as
tx's text source reads them (--config.data.source=text --config.data.src_lang=en
--config.data.tgt_lang=fr --config.data.train_prefix=<out>/train, dev_prefix and test_prefix
alike), and <out>/SOURCES.json naming every package (version, sha256 of the .deb, licenses, how
many pairs it gave), the size of each split and how many entries each rule dropped.

From what: the compiled message catalogues of free programs (gettext .mo, Qt .qm), in which the
English msgid is the programmer's text and the msgstr a volunteer translator's: human translations
of real text, not synthetic. The packages (PACKAGES, Debian 12) are downloaded with
`apt-get download` into the cache (reused by the next run) and read with `dpkg-deb --fsys-tarfile`
without unpacking; so the script needs a Debian machine whose package lists are fresh
(`apt-get update`). The text is interface text: menu items, dialog sentences, tooltips and help
paragraphs, compiler diagnostics, and the story dialogue of Wesnoth's campaigns; half the segments
are under five words.

Cleaning: a plural takes its singular; the msgctxt and the contexts written into the msgid
(Wesnoth's "female^Archer", GTK's "Action|Open", LyX's "Formats[[output]]", freeciv's "?short:")
are dropped, and so are accelerator marks (&, _, ~, ^ once in a word) and markup tags; entities
are unescaped and white space collapsed (also no-break spaces). Dropped: untranslated entries,
translator credits, segments with no word of two letters outside placeholders (%s, %1, {name},
$(ARG1)), identifiers and paths, keyword lists, segments over 200 words, and translations equal to
their source (ignoring case). A source seen before (same lower-cased words, punctuation aside)
keeps its first translation, in the order of PACKAGES. The split goes by a hash of that same key:
the 1,000 lowest hashes are test, the next 1,000 dev, the rest train, so no source is in two
splits and a re-run on the same packages gives the same files.

Licenses (from each package's debian/copyright, whose short names SOURCES.json lists; a
catalogue is under its program's license): LibreOffice MPL-2.0; Django BSD-3-Clause; GPL-2 or
later: Gramps, GnuCash, LyX, Scribus, Kdenlive, digiKam, KStars, Stellarium, LabPlot, Skrooge,
Kalzium, QGIS, MuseScore (GPL-2), Gnumeric (GPL-2 or 3), KeePassXC (GPL-2 or 3), Cinnamon,
Pidgin, HexChat, Anjuta, Rhythmbox, gedit, GNOME Shell and Control Center, VLC (and LGPL-2.1+),
WordPress, git (GPL-2), util-linux, dpkg, aptitude, Plasma, KDevelop, KMail, KOrganizer, Okular,
Konsole, Dolphin, Akregator, Lokalize, KTorrent, Krita and Calligra (GPL and LGPL), Wesnoth,
freeciv, Warzone 2100; GPL-3 or later: GIMP, Inkscape, FontForge, KiCad, calibre (GPL-3),
GCompris, GCC, binutils, GnuPG, Midnight Commander, Nautilus, darktable; LGPL: GTK, GLib,
glibc, Evolution and its data server, KDE PIM runtime; Qt's translations GPL-3 with the Qt
exception or LGPL-2.1. All free to use, change and redistribute; a corpus built from them is
best shared under the same terms, naming its sources (SOURCES.json).
"""

import argparse
import codecs
import collections
import glob
import hashlib
import html
import io
import json
import os
import re
import struct
import subprocess
import sys
import tarfile
import time
import zipfile
from collections.abc import Iterator

# Packages read, in priority order: a source found in two packages keeps the first one's
# translation. "{lang}" stands for the target language. The programs with the largest French
# catalogues in Debian 12 (bookworm), 1.2 GB of .debs; Qt's .qm and gettext's .mo alike.
PACKAGES = (
    # office, graphics, science and finance programs: full sentences in dialogs and help
    "libreoffice-l10n-{lang}",
    "gimp-data",
    "inkscape",
    "scribus-data",
    "gramps",
    "gnucash-common",
    "gnumeric-common",
    "lyx-common",
    "krita-l10n",
    "calligra-data",
    "digikam-data",
    "kdenlive-data",
    "musescore3-common",
    "qgis-common",
    "kstars-data",
    "stellarium-data",
    "labplot-data",
    "skrooge-common",
    "kalzium-data",
    "darktable",
    "fontforge-common",
    "kicad",
    "calibre",
    "gcompris-qt-data",
    # desktop and internet programs
    "evolution-common",
    "evolution-data-server-common",
    "vlc-l10n",
    "wordpress-l10n",
    "python3-django",
    "keepassxc",
    "cinnamon-l10n",
    "libgtk-3-common",
    "libglib2.0-data",
    "gnome-control-center-data",
    "nautilus-data",
    "gedit-common",
    "gnome-shell-common",
    "rhythmbox-data",
    "pidgin-data",
    "hexchat-common",
    "anjuta-common",
    "plasma-workspace-data",
    "kdevelop-l10n",
    "kmail",
    "kdepim-runtime",
    "korganizer",
    "okular",
    "konsole",
    "dolphin",
    "akregator",
    "lokalize",
    "ktorrent-data",
    "qttranslations5-l10n",
    # system tools: messages and compiler diagnostics
    "gcc-12-locales",
    "binutils-common",
    "git",
    "util-linux-locales",
    "gnupg-l10n",
    "libc-l10n",
    "dpkg",
    "aptitude-common",
    "mc-data",
    # games: Wesnoth's campaigns are story dialogue, the most sentence-like text here
    "wesnoth-1.16-data",
    "wesnoth-1.16-did",
    "wesnoth-1.16-dm",
    "wesnoth-1.16-dw",
    "wesnoth-1.16-ei",
    "wesnoth-1.16-httt",
    "wesnoth-1.16-l",
    "wesnoth-1.16-low",
    "wesnoth-1.16-nr",
    "wesnoth-1.16-sof",
    "wesnoth-1.16-sota",
    "wesnoth-1.16-sotbe",
    "wesnoth-1.16-thot",
    "wesnoth-1.16-trow",
    "wesnoth-1.16-tsg",
    "wesnoth-1.16-ttb",
    "wesnoth-1.16-utbs",
    "freeciv-data",
    "warzone2100-data",
)

HELD_OUT = 1000  # pairs in each of test and dev
MAX_WORDS = 200

# ---------------------------------------------------------------------------------------------
# Downloading


def fetch_deb(package: str, cache: str) -> str:
    """The cached .deb of `package`, downloaded with apt-get the first time."""
    found = sorted(glob.glob(os.path.join(cache, f"{glob.escape(package)}_*.deb")))
    if found:
        return found[-1]
    os.makedirs(cache, exist_ok=True)
    # apt's sandbox user cannot write into a root-owned cache; the download itself is the same
    res = subprocess.run(
        ["apt-get", "download", "-q", "-o", "APT::Sandbox::User=root", package],
        cwd=cache,
        capture_output=True,
        text=True,
    )
    found = sorted(glob.glob(os.path.join(cache, f"{glob.escape(package)}_*.deb")))
    if res.returncode != 0 or not found:
        hint = " (run `apt-get update` first?)" if "Unable to locate" in res.stderr else ""
        raise RuntimeError(f"apt-get download {package} failed{hint}: {res.stderr.strip()}")
    return found[-1]


def deb_version(deb: str) -> str:
    return subprocess.run(
        ["dpkg-deb", "-f", deb, "Version"], capture_output=True, text=True, check=True
    ).stdout.strip()


def sha256_file(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


# ---------------------------------------------------------------------------------------------
# Finding the catalogues inside a package


def is_catalogue(path: str, lang: str) -> bool:
    """A .mo or .qm file for `lang` itself (fr or fr_FR), not a regional variant (fr_CA)."""
    if not path.endswith((".mo", ".qm")):
        return False
    # fr/LC_MESSAGES/x.mo, x/fr.mo, admin-fr_FR.mo, qt_fr.qm
    return re.search(rf"(?:^|[/_.-]){lang}(?:_{lang.upper()})?(?:[/.]|$)", path) is not None


def deb_files(deb: str, wanted) -> Iterator[tuple[str, bytes]]:
    """(path, content) of the files in a .deb's data whose path `wanted` accepts, in tar order."""
    cmd = ["dpkg-deb", "--fsys-tarfile", deb]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        # streamed ("r|"): the data of games runs to hundreds of megabytes we do not need
        with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
            for member in tar:
                path = member.name.removeprefix("./")
                if member.isfile() and wanted(path):
                    yield path, tar.extractfile(member).read()
        proc.stdout.read()  # the tar's padding, so that dpkg-deb can finish
        if proc.wait() != 0:
            raise RuntimeError(f"{' '.join(cmd)}: {proc.stderr.read().decode().strip()}")
    finally:  # also when the caller stops early: dpkg-deb then dies of a broken pipe
        proc.stdout.close()
        proc.wait()
        proc.stderr.close()


def catalogues(deb: str, lang: str) -> tuple[list[tuple[str, bytes]], str | None]:
    """The `lang` catalogues of a .deb, sorted by path, and its copyright file's text."""
    found, copyright_text = [], None

    def wanted(path):
        locale_zip = path.endswith(".zip") and "locale" in path  # calibre zips its catalogues
        return is_catalogue(path, lang) or locale_zip or path.endswith("/copyright")

    for path, data in deb_files(deb, wanted):
        if path.endswith("/copyright"):
            copyright_text = copyright_text or data.decode("utf-8", "replace")
        elif path.endswith(".zip"):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                found += [(f"{path}/{n}", z.read(n)) for n in z.namelist() if is_catalogue(n, lang)]
        else:
            found.append((path, data))
    return sorted(found), copyright_text


def licenses(copyright_text: str | None) -> list[str]:
    """The licenses a debian/copyright names: its "License:" fields when machine-readable, else
    the GNU licenses its prose quotes ("... General Public License ... version 2 ...")."""
    text = copyright_text or ""
    names = [n.strip() for n in re.findall(r"^License:[ \t]*(\S[^\n]*)", text, re.M)]
    if not names:
        later = "+" if "any later version" in text else ""
        for lesser, version in GNU_LICENSE.findall(text):
            names.append(f"{'L' if lesser else ''}GPL-{version}{later}")
    return list(dict.fromkeys(names))


GNU_LICENSE = re.compile(
    r"GNU (Lesser |Library )?General Public\s+License[^.]{0,80}?version (\d(?:\.\d)?)"
)


# ---------------------------------------------------------------------------------------------
# Reading catalogues

MO_BYTE_ORDER = {b"\xde\x12\x04\x95": "<", b"\x95\x04\x12\xde": ">"}
QM_MAGIC = bytes.fromhex("3cb86418caef9c95cd211cbf60a1bddd")


def parse_mo(data: bytes) -> Iterator[tuple[str, str]]:
    """(msgid, msgstr) of a gettext .mo file: the context dropped, a plural as its singular."""
    order = MO_BYTE_ORDER.get(data[:4])
    if order is None:
        raise ValueError("not a .mo file")
    count, ids_at, strs_at = struct.unpack_from(order + "3I", data, 8)

    def string(table: int, i: int) -> bytes:
        length, offset = struct.unpack_from(order + "2I", data, table + 8 * i)
        return data[offset : offset + length]

    entries = [(string(ids_at, i), string(strs_at, i)) for i in range(count)]
    charset = mo_charset(dict(entries).get(b"", b""))
    for msgid, msgstr in entries:
        if not msgid:
            continue  # the header
        # "context\x04msgid\x00msgid_plural" -> "msgid"; "msgstr[0]\x00msgstr[1]" -> "msgstr[0]"
        msgid = msgid.rpartition(b"\x04")[2].partition(b"\x00")[0]
        msgstr = msgstr.partition(b"\x00")[0]
        yield msgid.decode(charset, "replace"), msgstr.decode(charset, "replace")


def mo_charset(header: bytes) -> str:
    """The charset a .mo header declares (UTF-8 when it declares none we know)."""
    m = re.search(rb"charset=([\w.:-]+)", header)
    name = m.group(1).decode("ascii") if m else "utf-8"
    try:
        return codecs.lookup(name).name
    except LookupError:  # "CHARSET" of an unfilled template
        return "utf-8"


def parse_qm(data: bytes) -> Iterator[tuple[str, str]]:
    """(source, translation) of a Qt .qm file (its Messages block; plurals as their first form)."""
    if data[:16] != QM_MAGIC:
        raise ValueError("not a .qm file")
    pos = 16
    while pos + 5 <= len(data):
        tag, length = data[pos], struct.unpack_from(">I", data, pos + 1)[0]
        pos += 5
        if tag == 0x69:  # Messages; the others are hashes, contexts, plural rules, language
            yield from qm_messages(data[pos : pos + length])
        pos += length


def qm_messages(block: bytes) -> Iterator[tuple[str, str]]:
    # A message is a run of (tag, value) fields closed by tag 1 (see Qt's qtranslator.cpp):
    # 3 translation (UTF-16BE), 6 source text, 7 context, 8 comment (UTF-8), 5 a 4-byte hash.
    pos, source, translations = 0, None, []
    while pos < len(block):
        tag = block[pos]
        pos += 1
        if tag == 1:
            if source and translations:
                yield source, translations[0]
            source, translations = None, []
        elif tag == 5:
            pos += 4
        elif tag in (3, 6, 7, 8):
            length = struct.unpack_from(">I", block, pos)[0]
            pos += 4
            if length == 0xFFFFFFFF:  # a null translation
                continue
            value = block[pos : pos + length]
            pos += length
            if tag == 3:
                translations.append(value.decode("utf-16-be", "replace"))
            elif tag == 6:
                source = value.decode("utf-8", "replace")
        else:
            return  # a field this reader does not know: its length is unknown, stop safely


def catalogue_pairs(path: str, data: bytes) -> Iterator[tuple[str, str]]:
    return parse_qm(data) if path.endswith(".qm") else parse_mo(data)


# ---------------------------------------------------------------------------------------------
# Cleaning

# Entries whose "translation" is the translators' names, not a translation.
CREDITS = {
    "translator-credits",
    "translator_credits",
    "translated-by",
    "NAME OF TRANSLATORS",
    "EMAIL OF TRANSLATORS",
    "Your names",
    "Your emails",
    "CREDIT_FOR_TRANSLATORS",
}
# printf (%s, %-5.2f, %1$s, %(name)s), Qt and KDE (%1), Python ({name}), LibreOffice ($(ARG1),
# %PRODUCTNAME), shell ($HOME)
PLACEHOLDER = re.compile(
    r"%(?:\d+\$|\([\w.]+\))?[-+ #0']*(?:\d+|\*)?(?:\.\d+)?(?:hh|ll|[hlLqjzt])?"
    r"[diouxXeEfFgGaAcsSpn@]"
    r"|%\d+|%[A-Z][A-Z_]+%?|\{[^{}]*\}|\$\([^)]*\)|\$\w+"
)
# Tags of HTML, Qt rich text, Pango, DocBook and KDE's KUIT, by name: "<options>" in a usage
# line is text, not markup.
TAG_NAMES = (
    "a|b|i|u|s|p|br|hr|nl|span|font|small|big|tt|em|strong|sub|sup|center|code|pre|nobr|h[1-6]"
    "|qt|html|body|head|li|ul|ol|div|table|tr|td|th|img|emphasis|filename|command|application"
    "|interface|shortcut|placeholder|note|warning|message|para|title|subtitle|link|email|envar"
    "|icode|bcode|numid|guilabel|guimenu|keycap|literal|ulink|quote"
)
TAG = re.compile(rf"</?(?:{TAG_NAMES})(?:\s[^<>]*)?/?>", re.I)
# A paragraph, line or cell boundary leaves a space (inserted before its tag).
BLOCK_TAG = re.compile(r"(?=</?(?:p|br|hr|nl|li|div|tr|td|th|h[1-6]|para|title|qt)\b)", re.I)
ENTITY = re.compile(r"&(?:#\d+|#x[0-9a-fA-F]+|[A-Za-z]\w*);")
# Keyboard accelerator marks: & (Qt, KDE, LibreOffice dialogs), _ (GTK), ~ (LibreOffice menus),
# ^ (aptitude).
MARKS = "&_~^"
# A disambiguating context written into the msgid (a prefix, or LyX's "Formats[[output]]"
# suffix), and LyX's menu shortcuts ("Open...|O").
CONTEXT_PREFIX = re.compile(
    r"^[a-z][\w +-]{1,39}\^(?=\S)"  # Wesnoth: female^Archer
    r"|^[^|\n]{1,60}\|\|?(?=[^|]+$)"  # GTK: Action|Open, Gramps: inflections||May
    r"|^\|[\w-]+\|"  # GnuPG: |pinentry-label|_OK
    r"|^\?[^:\n]{1,40}:(?=\S)"  # freeciv: ?pollution [short]:Pol
)
CONTEXT_SUFFIX = re.compile(r"\[\[[^\[\]]*\]\]$")
SHORTCUT_SUFFIX = re.compile(r"\|[^\W_]$")
# One token with a path or code character, or a key in camel case ("ClearInstrsBigChanges").
IDENTIFIER = re.compile(r"\S*[_./:@\\=#]\S*|\S*[a-z][A-Z]\S*[a-z][A-Z]\S*")


def clean_pair(source: str, target: str) -> tuple[str, str] | None:
    """The cleaned (source, target), or None when the pair should be dropped."""
    source, target = normalize_pair(source, target)
    return None if why_dropped(source, target) else (source, target)


def normalize_pair(source: str, target: str) -> tuple[str, str]:
    """Contexts, accelerators and markup removed, entities unescaped, spaces collapsed."""
    source, target = strip_contexts(source, target)
    source, target = strip_accelerators(source, target)
    return plain_text(source), plain_text(target)


def strip_contexts(source: str, target: str) -> tuple[str, str]:
    if SHORTCUT_SUFFIX.search(source) and SHORTCUT_SUFFIX.search(target):
        source, target = SHORTCUT_SUFFIX.sub("", source), SHORTCUT_SUFFIX.sub("", target)
    source, target = CONTEXT_SUFFIX.sub("", source), CONTEXT_SUFFIX.sub("", target)
    prefix = CONTEXT_PREFIX.match(source)
    # aptitude's "Search ^Backwards" and options "-u|-i" keep the mark in the translation
    if prefix and prefix.group()[-1] not in target.removeprefix(prefix.group()):
        source, target = source[prefix.end() :], target.removeprefix(prefix.group())
    return source, target


def strip_accelerators(source: str, target: str) -> tuple[str, str]:
    """Removes a mark where each side holds at most one: two or more are literal text."""
    for mark in MARKS:
        in_source, in_target = accelerators(source, mark), accelerators(target, mark)
        if len(in_source) <= 1 and len(in_target) <= 1:
            source, target = remove_at(source, in_source), remove_at(target, in_target)
    return source, target


def accelerators(text: str, mark: str) -> list[int]:
    """Offsets of `mark` standing in a plain word before a letter or digit: "_Open", "Sa_ve",
    "(&O)"; not "__builtin_tgmath", "&&", "&amp;" or "~/.config"."""
    m = re.escape(mark)
    part = r"[^\W_]+(?:[-'’][^\W_]+)*"  # a word, maybe hyphenated: "&Auto-Type"
    word = re.compile(rf"[^\w\s{m}]*(?:{part}[-'’])?[^\W_]*({m}){part}[^\w\s]*")
    found = []
    for token in re.finditer(r"\S+", text):
        match = word.fullmatch(token.group())
        if match and not (mark == "&" and ENTITY.match(token.group(), match.start(1))):
            found.append(token.start() + match.start(1))
    return found


def remove_at(text: str, offsets: list[int]) -> str:
    for i in sorted(offsets, reverse=True):
        text = text[:i] + text[i + 1 :]
    return text


def plain_text(text: str) -> str:
    text = BLOCK_TAG.sub(" ", text)
    text = TAG.sub("", text)
    text = ENTITY.sub(lambda m: html.unescape(m.group()), text)
    return " ".join(text.split())  # also tabs, newlines and no-break spaces


def why_dropped(source: str, target: str) -> str | None:
    """The reason to drop a normalized pair, or None to keep it."""
    if not source or not target:
        return "untranslated"
    if source in CREDITS or "\ufffd" in source + target:
        return "credits or bad bytes"
    if not has_words(source) or not has_words(target):
        return "no words"
    if IDENTIFIER.fullmatch(source):
        return "identifier"
    if source.count("|") >= 3:  # keyword lists, Wesnoth's name generators
        return "list"
    if max(len(source.split()), len(target.split())) > MAX_WORDS:
        return "too long"
    if source.casefold() == target.casefold():
        return "same as source"
    return None


def has_words(text: str) -> bool:
    """A run of two letters outside placeholders."""
    return re.search(r"[^\W\d_]{2}", PLACEHOLDER.sub(" ", text)) is not None


def dedup_key(source: str) -> str:
    """Sources that differ only in case, punctuation or spacing are one source."""
    return " ".join(re.sub(r"[\W_]+", " ", source.casefold()).split())


# ---------------------------------------------------------------------------------------------
# Building


def collect(packages, lang: str, cache: str, log=print):
    """Clean, deduplicated pairs in package order and one record per package."""
    pairs, seen, records, dropped = [], set(), [], collections.Counter()
    for package in packages:
        deb = fetch_deb(package, cache)
        found, copyright_text = catalogues(deb, lang)
        entries = kept = 0
        for path, data in found:
            for source, target in catalogue_pairs(path, data):
                entries += 1
                source, target = normalize_pair(source, target)
                reason = why_dropped(source, target) or (
                    "duplicate" if dedup_key(source) in seen else None
                )
                if reason:
                    dropped[reason] += 1
                    continue
                seen.add(dedup_key(source))
                pairs.append((source, target))
                kept += 1
        records.append(package_record(package, deb, copyright_text, len(found), entries, kept))
        log(f"  {package:32s} {len(found):4d} catalogues {entries:7d} entries {kept:7d} pairs")
    return pairs, records, dropped


def package_record(package, deb, copyright_text, n_catalogues, entries, kept) -> dict:
    return {
        "package": package,
        "version": deb_version(deb),
        "deb": os.path.basename(deb),
        "sha256": sha256_file(deb),
        "licenses": licenses(copyright_text),
        "catalogues": n_catalogues,
        "entries": entries,
        "pairs": kept,
    }


def split_pairs(
    pairs: list[tuple[str, str]], held_out: int = HELD_OUT, train_pairs: int = 0
) -> dict[str, list]:
    """test: the `held_out` sources of lowest hash, dev: the next ones, train: the rest (or,
    with `train_pairs`, only that many of them: the next ones by hash, a uniform sample that a
    larger `train_pairs` extends).

    Each split keeps the pairs' original order.
    """

    def rank(pair):
        return hashlib.sha256(dedup_key(pair[0]).encode()).hexdigest()

    ordered = sorted(range(len(pairs)), key=lambda i: rank(pairs[i]))
    test, dev = set(ordered[:held_out]), set(ordered[held_out : 2 * held_out])
    train = set(ordered[2 * held_out : 2 * held_out + train_pairs] if train_pairs else ())
    splits = {"train": [], "dev": [], "test": []}
    for i, pair in enumerate(pairs):
        if i in test or i in dev:
            splits["test" if i in test else "dev"].append(pair)
        elif not train_pairs or i in train:
            splits["train"].append(pair)
    return splits


def write_splits(out: str, splits: dict[str, list], src: str, tgt: str) -> None:
    os.makedirs(out, exist_ok=True)
    for name, pairs in splits.items():
        for lang, column in ((src, 0), (tgt, 1)):
            with open(os.path.join(out, f"{name}.{lang}"), "w", encoding="utf-8") as f:
                f.writelines(pair[column] + "\n" for pair in pairs)


def build(
    out: str,
    pair: str = "en-fr",
    cache: str | None = None,
    log=print,
    train_pairs: int = 0,
    only: str = "",
    exclude: str = "",
) -> dict:
    """Downloads, reads, cleans, splits and writes the corpus; returns SOURCES.json's content.
    `only` / `exclude`: regular expressions that keep / leave out packages by name (a corpus of
    one domain: --only wesnoth is a game's story dialogue, --exclude wesnoth interface text)."""
    src, tgt = pair.split("-")
    cache = cache or os.path.join(os.path.expanduser("~"), ".cache", "tx", "real_corpus")
    start = time.time()
    packages = [
        p.format(lang=tgt)
        for p in PACKAGES
        if (not only or re.search(only, p)) and not (exclude and re.search(exclude, p))
    ]
    pairs, records, dropped = collect(packages, tgt, cache, log)
    splits = split_pairs(pairs, train_pairs=train_pairs)
    write_splits(out, splits, src, tgt)
    sources = {
        "pair": pair,
        "built_by": "python benchmarks/real_corpus.py --out DIR --pair "
        + pair
        + (f" --train-pairs {train_pairs}" if train_pairs else "")
        + (f" --only '{only}'" if only else "")
        + (f" --exclude '{exclude}'" if exclude else ""),
        "splits": {name: len(p) for name, p in splits.items()},
        "dropped": dict(dropped.most_common()),
        "seconds": round(time.time() - start, 1),
        "packages": records,
    }
    with open(os.path.join(out, "SOURCES.json"), "w", encoding="utf-8") as f:
        json.dump(sources, f, indent=1, ensure_ascii=False)
    return sources


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, help="folder for the split files and SOURCES.json")
    parser.add_argument("--pair", default="en-fr", choices=["en-fr", "en-es", "en-nl"])
    parser.add_argument("--cache", help="folder for the downloaded .debs (reused)")
    parser.add_argument(
        "--train-pairs",
        type=int,
        default=0,
        metavar="N",
        help="keep only N training pairs (by hash: a uniform sample; dev and test unchanged)",
    )
    parser.add_argument("--only", default="", metavar="REGEX", help="keep the packages it matches")
    parser.add_argument("--exclude", default="", metavar="REGEX", help="leave out those it matches")
    args = parser.parse_args(argv)
    if args.train_pairs < 0:
        parser.error(f"--train-pairs must be >= 0, got {args.train_pairs}")
    sources = build(
        args.out,
        args.pair,
        args.cache,
        train_pairs=args.train_pairs,
        only=args.only,
        exclude=args.exclude,
    )
    print(f"{args.out}: {sources['splits']} in {sources['seconds']} s")
    print(f"dropped: {sources['dropped']}")


if __name__ == "__main__":
    sys.exit(main())
