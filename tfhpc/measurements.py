"""`make measurements`: docs/measurements.md generated from the records in docs/measurements/records.toml.

One job: load the records file, validate it (every problem is one line naming the record and the fix), render the
page. The file defines the machines once, the page's sections with their tables and the prose that says how a figure
is taken, then the records: one a measured figure or table row, appended at the end. Rows are newest first; a table
wider than the page splits its figure columns into parts that repeat the row's name, and one whose rows are too wide
even so becomes a list, one item a row.
"""
from __future__ import annotations

import datetime
import re
import tomllib
from pathlib import Path

from .common import REPO_ROOT, UserError

RECORDS = REPO_ROOT / "docs" / "measurements" / "records.toml"
PAGE = REPO_ROOT / "docs" / "measurements.md"
MAX_WIDTH = 120
FIELDS = {"file": {"text", "machines", "sections", "records"},
          "section": {"id", "title", "level", "text", "after", "tables"},
          "table": {"id", "what", "columns", "text", "after", "notes"},
          "record": {"section", "table", "date", "commit", "machine", "what", "figures", "note", "see"}}
COMMIT = re.compile(r"[0-9a-f]{7,40}")
# A wrapped line must not begin with what Markdown would read as a list item, a heading or a quote.
BLOCK_START = re.compile(r"(\d+[.)]|[-+*>]|#+)")


def load(path: Path = RECORDS) -> dict:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise UserError(f"{_name(path)}: not valid TOML ({error}): fix the file") from None


def _name(path: Path) -> str:
    return str(path.relative_to(REPO_ROOT)) if path.is_relative_to(REPO_ROOT) else str(path)


def _fail(where: str, problem: str) -> None:
    raise UserError(f"{_name(RECORDS)}: {where}: {problem}".replace("\n", " "))


def _known(where: str, kind: str, entry: dict) -> None:
    unknown = set(entry) - FIELDS[kind]
    if unknown:
        _fail(where, f"unknown field(s) {', '.join(sorted(unknown))}: use {', '.join(sorted(FIELDS[kind]))}")


def validate(data: dict) -> None:
    """Raise a one-line UserError on the first problem: unknown keys, missing fields, a bad date or commit."""
    _known("top level", "file", data)
    machines = data.get("machines")
    if not isinstance(machines, dict) or not machines:
        _fail("[machines]", "no machine defined: add [machines.KEY] with a description")
    for key, machine in machines.items():
        if not isinstance(machine, dict) or not isinstance(machine.get("description"), str):
            _fail(f"[machines.{key}]", "needs description = \"cores, memory, GPU, ...\"")
    tables = {}
    section_ids = set()
    for number, section in enumerate(data.get("sections", []), 1):
        where = f"section {number} ({section.get('id', '?')})"
        _known(where, "section", section)
        if not section.get("id") or not section.get("title") or section.get("level") not in (2, 3):
            _fail(where, "needs id, title and level (2 or 3)")
        if section["id"] in section_ids:
            _fail(where, "its id is used twice: give each section its own id")
        section_ids.add(section["id"])
        for table in section.get("tables", []):
            _known(f"{where}, table {table.get('id', '?')}", "table", table)
            key = (section["id"], table.get("id"))
            if key in tables or not table.get("id"):
                _fail(where, f"table id {table.get('id')!r} is missing or used twice in the section")
            if not isinstance(table.get("what"), str) or not table.get("columns"):
                _fail(f"{where}, table {table['id']}", "needs what (the row name's header) and columns")
            tables[key] = table
    used = set()
    for number, record in enumerate(data.get("records", []), 1):
        where = f"record {number} ({record.get('date', 'no date')}, {str(record.get('what', ''))[:40]!r})"
        _known(where, "record", record)
        key = (record.get("section"), record.get("table"))
        if record.get("section") not in section_ids:
            _fail(where, f"section {record.get('section')!r} is not defined: add it under [[sections]] or fix the id")
        if key not in tables:
            _fail(where, f"section {key[0]} has no table {key[1]!r}: add it under [[sections.tables]] or fix the id")
        table = tables[key]
        used.add(key)
        if not isinstance(record.get("date"), datetime.date) or isinstance(record.get("date"), datetime.datetime):
            _fail(where, "needs date = YYYY-MM-DD (a TOML date, no quotes)")
        if record.get("machine") not in machines:
            _fail(where, f"machine {record.get('machine')!r} is not under [machines]: define it or fix the key")
        if not isinstance(record.get("commit", ""), str) or not COMMIT.fullmatch(record.get("commit") or "0" * 7):
            _fail(where, "commit must be a short commit id (7+ hex digits) or empty")
        for field in ["what"] + [key for key in ("note",) if key in record]:
            value = record.get(field)
            if not isinstance(value, str) or not value.strip() or "\n" in value.strip():
                _fail(where, f"{field} must be one line of text")
        if not isinstance(record.get("see", []), list):
            _fail(where, "see must be a list of its table's note keys, e.g. see = [\"1\"]")
        figures = record.get("figures")
        if not isinstance(figures, dict) or not figures:
            _fail(where, "needs figures = { \"COLUMN\" = \"VALUE UNIT\", ... }")
        for column, value in figures.items():
            if column not in table["columns"]:
                _fail(where, f"figure {column!r} is not a column of its table: use one of {table['columns']}")
            if isinstance(value, bool) or not isinstance(value, (str, int, float)) or not str(value).strip():
                _fail(where, f"figure {column!r} must be a number or a one-line text with its unit")
        for note in record.get("see", []):
            if note not in table.get("notes", {}):
                _fail(where, f"see {note!r} is not among its table's notes")
    for key in tables.keys() - used:
        _fail(f"section {key[0]}, table {key[1]}", "has no record: add one or remove the table")


def _wrap(text: str, first: str, indent: str) -> list[str]:
    """Greedy wrap at MAX_WIDTH; a word Markdown would read as a block start never begins a line."""
    lines, words = [], " ".join(text.split()).split(" ")
    line = first + words[0]
    for previous, word in zip(words, words[1:]):
        if len(line) + 1 + len(word) <= MAX_WIDTH:
            line += " " + word
        elif BLOCK_START.fullmatch(word) and line.rsplit(" ", 1)[-1] == previous and " " in line[len(first):]:
            lines.append(line.rsplit(" ", 1)[0])
            line = indent + previous + " " + word
        else:
            lines.append(line)
            line = indent + word
    return lines + [line]


def _cell(value) -> str:
    return str(value).replace("|", "\\|")


def _markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(row) + " |" for row in rows]


def _notes_of(table: dict, record: dict) -> list[str]:
    return [table["notes"][key] for key in record.get("see", [])] + ([record["note"]] if "note" in record else [])


def _render_table(table: dict, records: list[dict], default_machine: str) -> list[str]:
    records = sorted(records, key=lambda record: record["date"], reverse=True)  # stable: file order within a date
    notes: list[str] = []  # footnotes, numbered in order of first use; rows with the same text share one
    for record in records:
        notes += [note for note in _notes_of(table, record) if note not in notes]
    names = []
    for record in records:
        marks = [notes.index(note) + 1 for note in _notes_of(table, record)]
        names.append(_cell(record["what"]) + (f" ({', '.join(map(str, marks))})" if marks else ""))
    # A date or commit all rows share is said once above the table; a record with another brings the column back.
    lead, lead_cells, shared = [], [[] for _ in records], []
    for field in ("date", "commit"):
        found = {str(record.get(field) or "") for record in records}
        code = "`" if field == "commit" else ""
        if len(found) > 1:
            lead.append(field)
            for cells, record in zip(lead_cells, records):
                cells.append(f"{code}{record[field]}{code}" if record.get(field) else "")
        elif found != {""}:
            shared.append(("on " if field == "date" else "at ") + f"{code}{found.pop()}{code}")
    columns = [column for column in table["columns"] if any(column in record["figures"] for record in records)]
    if any(record["machine"] != default_machine for record in records):
        columns.append("machine")
    values = [[_cell(record["figures"].get(column, record["machine"] if column == "machine" else ""))
               for column in columns] for record in records]

    def part(chosen: list[int]) -> list[str]:
        return _markdown_table(lead + [table["what"]] + [columns[index] for index in chosen],
                               [cells + [name] + [row[index] for index in chosen]
                                for cells, name, row in zip(lead_cells, names, values)])

    for count in range(1, len(columns) + 1):  # the fewest parts of about equal columns that fit the page
        size = -(-len(columns) // count)
        parts = [list(range(start, min(start + size, len(columns)))) for start in range(0, len(columns), size)]
        if all(max(map(len, part(chosen))) <= MAX_WIDTH for chosen in parts):
            break
    out = [f"Measured {' '.join(shared)}.", ""] if shared else []
    for chosen in parts:
        out += part(chosen) + [""]
    out.pop()
    if max(map(len, out)) > MAX_WIDTH:  # a row too wide even with one figure column: a list, one item a row
        out = out[:2] if shared else []
        for cells, name, row in zip(lead_cells, names, values):
            figures = "; ".join(f"{column}: {value}" for column, value in zip(columns, row) if value)
            out += _wrap(", ".join(cell for cell in cells if cell) + ": " * any(cells) + f"{name} — {figures}",
                         "- ", "  ")
    if notes:
        out.append("")
        for number, note in enumerate(notes, 1):
            out += _wrap(note, f"{number}. ", " " * len(f"{number}. "))
    return out


def render(data: dict) -> str:
    validate(data)
    counts: dict[str, int] = {}
    for record in data["records"]:
        counts[record["machine"]] = counts.get(record["machine"], 0) + 1
    default_machine = max(counts, key=counts.get)
    out = [f"<!-- Generated by `make measurements` from {_name(RECORDS)}: edit that file, not this page. -->",
           "# Measurements", "",
           f"Generated by `make measurements` from [measurements/records.toml](measurements/records.toml), where each "
           "figure", "is a record with its date, commit and machine; add a measurement there, not here.", ""]
    out += data.get("text", "").strip().splitlines() + [""]
    out.append(f"Machines (a table names the machine where it is not `{default_machine}`):")
    for key, machine in data["machines"].items():
        out += _wrap(f"`{key}`: {machine['description']}", "- ", "  ")
    out.append("")
    for section in data["sections"]:
        out += ["#" * section["level"] + " " + section["title"], ""]
        if section.get("text"):
            out += section["text"].strip().splitlines() + [""]
        for table in section.get("tables", []):
            if table.get("text"):
                out += table["text"].strip().splitlines() + [""]
            records = [record for record in data["records"]
                       if (record["section"], record["table"]) == (section["id"], table["id"])]
            out += _render_table(table, records, default_machine) + [""]
            if table.get("after"):
                out += table["after"].strip().splitlines() + [""]
        if section.get("after"):
            out += section["after"].strip().splitlines() + [""]
    page = "\n".join(out).rstrip("\n") + "\n"
    for number, line in enumerate(page.splitlines(), 1):
        if len(line) > MAX_WIDTH:
            _fail(f"page line {number}", f"{len(line)} characters (at most {MAX_WIDTH}): rewrap the prose that "
                  f"begins {line[:40]!r}")
    return page


def write(records: Path = RECORDS, page: Path = PAGE) -> Path:
    page.write_text(render(load(records)))
    return page


def check(records: Path = RECORDS, page: Path = PAGE) -> None:
    if not page.is_file() or page.read_text() != render(load(records)):
        raise UserError(f"{_name(page)} is out of date with {_name(records)}: run `make measurements`")
