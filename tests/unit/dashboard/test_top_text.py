"""`ipcount top`'s terminal lines: one block per window in window order, corrections as marked
update blocks that say what changed."""

from __future__ import annotations

from ipcount.dashboard.model import WindowBook
from ipcount.dashboard.text import TopPrinter, count_forgotten
from ipcount.formats.avro import IpCount

W = 5000
T0 = 1_700_000_000_000  # 2023-11-14T22:13:20Z


def _r(window: int, ip: str, count: int) -> IpCount:
    start = T0 + window * W
    return IpCount(start, start + W, ip, count)


def test_a_window_block_has_a_header_and_one_line_per_top_ip() -> None:
    book = WindowBook()
    for ip, count in [("203.0.113.7", 1284), ("198.51.100.4", 9000), ("10.0.0.1", 330)]:
        book.add(_r(0, ip, count), "final")
    lines = TopPrinter(2).lines(book)
    assert lines == [
        "window 2023-11-14T22:13:20Z +5s  10614 requests from 3 IPs",
        "22:13:20Z  198.51.100.4      9000   84.8%",
        "22:13:20Z  203.0.113.7       1284   12.1%",
    ]


def test_each_window_is_printed_once_and_in_window_order() -> None:
    book = WindowBook()
    printer = TopPrinter(1)
    book.add(_r(1, "10.0.0.1", 2), "final")
    book.add(_r(0, "10.0.0.1", 1), "final")
    first = printer.lines(book)
    assert [line for line in first if line.startswith("window")] == [
        "window 2023-11-14T22:13:20Z +5s  1 requests from 1 IPs",
        "window 2023-11-14T22:13:25Z +5s  2 requests from 1 IPs",
    ]
    assert printer.lines(book) == []  # nothing new
    book.add(_r(2, "10.0.0.1", 3), "final")
    assert printer.lines(book)[0].startswith("window 2023-11-14T22:13:30Z")


def test_corrections_are_one_compact_block_per_refresh() -> None:
    # Late records a shipper retried correct windows already shown: one line per window in one
    # block after the new windows, so the live windows stay readable.
    book = WindowBook()
    printer = TopPrinter(2)
    for w in (0, 1):
        book.add(_r(w, "10.0.0.1", 5), "final")
        book.add(_r(w, "10.0.0.2", 4), "final")
    printer.lines(book)
    book.add(_r(0, "10.0.0.2", 3), "late")
    book.add(_r(1, "10.0.0.1", 1), "late")
    book.add(_r(2, "10.0.0.1", 7), "final")
    assert printer.lines(book) == [
        "window 2023-11-14T22:13:30Z +5s  7 requests from 1 IPs",
        "22:13:30Z  10.0.0.1             7  100.0%",
        "corrections  4 late records for 2 earlier windows:",
        "  22:13:20Z +5s  +3 late: 12 requests from 2 IPs (was 9)",
        "  22:13:25Z +5s  +1 late: 10 requests from 2 IPs (was 9)",
    ]


def test_an_older_window_only_late_records_reached_joins_the_corrections() -> None:
    book = WindowBook()
    printer = TopPrinter(2)
    book.add(_r(5, "10.0.0.1", 5), "final")
    printer.lines(book)
    book.add(_r(1, "10.0.0.9", 2), "late")
    assert printer.lines(book) == [
        "corrections  2 late records for 1 earlier window:",
        "  22:13:25Z +5s  +2 late: 2 requests from 1 IPs (no final result: every record came late)",
    ]


def test_corrections_read_with_the_results_are_folded_into_the_first_block() -> None:
    book = WindowBook()
    book.add(_r(0, "10.0.0.1", 5), "final")
    book.add(_r(0, "10.0.0.1", 1), "late")
    assert TopPrinter(5).lines(book) == [
        "window 2023-11-14T22:13:20Z +5s  6 requests from 1 IPs, 1 of them late",
        "22:13:20Z  10.0.0.1             6  100.0%  (+1 late)",
    ]


def test_a_window_only_late_records_reached_says_so() -> None:
    book = WindowBook()
    book.add(_r(0, "10.0.0.1", 2), "late")
    assert TopPrinter(5).lines(book)[0] == (
        "window 2023-11-14T22:13:20Z +5s  2 requests from 1 IPs, 2 of them late "
        "(no final result: every record came late)"
    )


def test_long_ipv6_addresses_widen_the_column() -> None:
    book = WindowBook()
    ip6 = "2001:db8:85a3:1234:5678:8a2e:370:7334"
    book.add(_r(0, ip6, 2), "final")
    book.add(_r(0, "10.0.0.1", 1), "final")
    lines = TopPrinter(5).lines(book)
    assert lines[1] == f"22:13:20Z  {ip6}      2   66.7%"
    assert lines[2] == f"22:13:20Z  {'10.0.0.1':{len(ip6)}}      1   33.3%"


def test_json_records_mark_updates() -> None:
    book = WindowBook()
    printer = TopPrinter(1)
    book.add(_r(0, "10.0.0.1", 1), "final")
    (first,) = printer.records(book)
    book.add(_r(0, "10.0.0.1", 1), "late")
    (second,) = printer.records(book)
    assert (first["update"], first["total"]) == (False, 1)
    assert (second["update"], second["total"], second["top"][0]["late"]) == (True, 2, 1)


def test_records_not_shown_are_named_by_kind() -> None:
    assert count_forgotten({"final": 2, "late": 1}) == "2 final results and 1 late correction"
    assert count_forgotten({"final": 0, "late": 3}) == "3 late corrections"
