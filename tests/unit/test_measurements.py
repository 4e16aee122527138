"""docs/measurements.md is generated from docs/measurements/records.toml (`make measurements`): the committed page is
the rendering, every record is dated and placed on a machine, the page fits 120 columns, and neither the records nor
the page speak of the workflow that produced the figures. A broken record fails in one line that names the fix."""
import copy
import datetime

import pytest

from tfhpc import measurements
from tfhpc.common import UserError

# Words of the workflow that produced a figure, which mean nothing to a reader of the project.
WORKFLOW_WORDS = ("stop ", "session", "helper", "another engineer", "this round")


@pytest.fixture(scope="module")
def records():
    return measurements.load()


def a_record(**fields):
    record = {"section": "build-times", "table": "builds", "date": datetime.date(2026, 11, 26), "commit": "",
              "machine": "dev", "what": "`make image`, cold", "figures": {"time": "400 s"}}
    return {**record, **fields}


def failure(data):
    with pytest.raises(UserError) as caught:
        measurements.validate(data)
    message = str(caught.value)
    assert "\n" not in message and message.startswith("docs/measurements/records.toml: ")
    return message


def test_the_committed_page_is_the_rendering_of_the_records(records):
    assert measurements.PAGE.read_text() == measurements.render(records), (
        "docs/measurements.md differs from docs/measurements/records.toml: run `make measurements`")


def test_check_fails_on_a_stale_page_and_names_the_fix(tmp_path):
    stale = tmp_path / "measurements.md"
    stale.write_text("# Measurements\n")
    with pytest.raises(UserError, match=r"out of date .*: run `make measurements`$"):
        measurements.check(page=stale)
    measurements.check()  # the committed page


def test_every_record_has_a_date_a_known_machine_and_figures(records):
    assert records["records"], "no records"
    for record in records["records"]:
        assert type(record["date"]) is datetime.date, record
        assert record["machine"] in records["machines"], record
        assert record["figures"] and all(str(value).strip() for value in record["figures"].values()), record


@pytest.mark.parametrize("path", [measurements.RECORDS, measurements.PAGE], ids=lambda path: path.name)
def test_no_workflow_words(path):
    text = path.read_text().lower()
    found = [word for word in WORKFLOW_WORDS if word in text]
    assert not found, f"{path.name} speaks of the workflow ({', '.join(found)}): say what was measured and how"


def test_no_line_of_the_page_is_wider_than_120_characters():
    wide = [number for number, line in enumerate(measurements.PAGE.read_text().splitlines(), 1) if len(line) > 120]
    assert not wide, f"docs/measurements.md lines over 120 characters: {wide}"


def test_a_record_for_a_section_that_does_not_exist_fails_in_one_line(records):
    data = copy.deepcopy(records)
    data["records"].append(a_record(section="no-such-section"))
    assert "section 'no-such-section' is not defined" in failure(data)


def test_a_table_without_records_fails(records):
    data = copy.deepcopy(records)
    data["sections"][0]["tables"].append({"id": "empty", "what": "run", "columns": ["time"]})
    assert "has no record" in failure(data)


@pytest.mark.parametrize("fields, problem", [
    ({"date": "2026-11-26"}, "needs date = YYYY-MM-DD"),
    ({"date": None}, "needs date = YYYY-MM-DD"),
    ({"machine": "laptop"}, "machine 'laptop' is not under [machines]"),
    ({"figures": {}}, "needs figures"),
    ({"figures": {"speed": "1 GB/s"}}, "figure 'speed' is not a column"),
    ({"commit": "main"}, "commit must be a short commit id"),
    ({"what": ""}, "what must be one line"),
    ({"weather": "fine"}, "unknown field(s) weather"),
], ids=["date-as-text", "no-date", "machine", "no-figures", "column", "commit", "what", "field"])
def test_a_broken_record_fails_in_one_line(records, fields, problem):
    data = copy.deepcopy(records)
    data["records"].append(a_record(**fields))
    assert problem in failure(data)


def test_a_misspelt_table_field_fails(records):
    data = copy.deepcopy(records)
    data["sections"][0]["tables"][0]["colums"] = ["time"]
    assert "unknown field(s) colums" in failure(data)


def test_a_row_too_wide_for_any_table_becomes_a_list_item(records):
    data = copy.deepcopy(records)
    data["records"].append(a_record(what="a long description of what was built " * 4, date=datetime.date(2099, 1, 1)))
    section = measurements.render(data).split("## Build times", 1)[1].split("\n## ", 1)[0]
    assert "\n- 2099-01-01" in section and "| date |" not in section
    assert max(map(len, section.splitlines())) <= measurements.MAX_WIDTH


def test_an_appended_record_is_the_only_step(records):
    """A new record lands in its table, newest first, with no other edit; rows keep the file's order within a day."""
    data = copy.deepcopy(records)
    data["records"].append(a_record(what="`make image`, a new measurement", date=datetime.date(2099, 1, 1)))
    page = measurements.render(data)
    section = page.split("## Build times", 1)[1]
    assert section.index("2099-01-01") < section.index("2026-11-24") < section.index("2026-11-23")
    assert "`make image`, a new measurement" in section
