"""bot.render's cuts to Discord's limits: `truncate` marks what it cut, and `fit_embed` keeps every part
under its own limit and the whole embed under 6000 characters, dropping the last fields rather than
sending an embed Discord would refuse (a 400 loses the whole message)."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from bot.render import (
    DESCRIPTION_MAX,
    EMBED_TOTAL_MAX,
    FIELD_NAME_MAX,
    FIELD_VALUE_MAX,
    FIELDS_MAX,
    TITLE_MAX,
    fit_embed,
    truncate,
)


def test_truncate_keeps_text_that_fits_and_marks_a_cut() -> None:
    assert truncate("abc", 3) == "abc"
    assert truncate("abcd", 3) == "ab…" and len(truncate("x" * 5000, 2000)) == 2000


def total(embed: Any) -> int:
    fields = embed.get("fields", [])
    return (
        len(embed["title"])
        + len(embed.get("description", ""))
        + sum(len(f["name"]) + len(f["value"]) for f in fields)
    )


def test_a_huge_embed_is_cut_part_by_part_then_by_its_last_fields() -> None:
    embed = {
        "title": "t" * 300,
        "description": "d" * 5000,
        "fields": [{"name": f"n{i}" * 200, "value": "v" * 2000, "inline": True} for i in range(30)],
    }
    fitted = fit_embed(embed)  # type: ignore[arg-type]
    assert len(fitted["title"]) == TITLE_MAX and fitted["title"].endswith("…")
    assert len(fitted["description"]) == DESCRIPTION_MAX
    assert fitted["fields"], "some fields fit after the title and description"
    for field in fitted["fields"]:
        assert len(field["name"]) <= FIELD_NAME_MAX and len(field["value"]) <= FIELD_VALUE_MAX
        assert field["inline"] is True  # the field's other keys are kept
    assert total(fitted) <= EMBED_TOTAL_MAX
    names = [f["name"] for f in fitted["fields"]]
    assert names == [
        truncate(f"n{i}" * 200, FIELD_NAME_MAX) for i in range(len(names))
    ]  # the first, in order
    assert embed["title"] == "t" * 300  # the caller's embed is not changed


def test_an_empty_field_value_is_shown_as_a_dash() -> None:
    fitted = fit_embed({"title": "x", "fields": [{"name": "cost", "value": ""}]})  # type: ignore[typeddict-item]
    assert fitted["fields"] == [{"name": "cost", "value": "-"}]


PART = st.text(max_size=3000)


@settings(max_examples=200, derandomize=True, deadline=None)
@given(PART, st.none() | st.text(max_size=6000), st.lists(st.tuples(PART, PART), max_size=40))
def test_any_embed_fits_discords_limits(
    title: str, description: str | None, fields: list[tuple[str, str]]
) -> None:
    embed: dict[str, Any] = {"title": title, "fields": [{"name": n, "value": v} for n, v in fields]}
    if description is not None:
        embed["description"] = description
    fitted = fit_embed(embed)  # type: ignore[arg-type]
    assert len(fitted["title"]) <= TITLE_MAX and len(fitted.get("description", "")) <= DESCRIPTION_MAX
    assert len(fitted["fields"]) <= FIELDS_MAX and total(fitted) <= EMBED_TOTAL_MAX
