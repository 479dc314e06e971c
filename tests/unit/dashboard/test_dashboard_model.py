"""The one top-N computation `ipcount top` and the dashboard share: ranking, ties, shares, late
corrections folded into totals, N larger than the IPs present, and the bounded window book."""

from __future__ import annotations

import pytest

from ipcount.dashboard.model import WindowBook, top_rows
from ipcount.formats.avro import IpCount

W = 5000
T0 = 1_700_000_000_000


def _r(window: int, ip: str, count: int) -> IpCount:
    start = T0 + window * W
    return IpCount(start, start + W, ip, count)


def test_ranks_by_count_with_shares_of_the_whole_window() -> None:
    book = WindowBook()
    for ip, count in [("10.0.0.1", 10), ("10.0.0.2", 60), ("10.0.0.3", 30)]:
        book.add(_r(0, ip, count), "final")
    (w,) = book.top(2)
    assert (w.window_start, w.window_end, w.total, w.ips, w.late) == (T0, T0 + W, 100, 3, 0)
    assert [(r.ip, r.count) for r in w.rows] == [("10.0.0.2", 60), ("10.0.0.3", 30)]
    # The share is of the window's total over all IPs, not of the top N shown.
    assert [r.share for r in w.rows] == [0.6, 0.3]


def test_ties_are_broken_by_address_order_whatever_the_arrival_order() -> None:
    ips = ["10.0.0.10", "2001:db8::1", "10.0.0.9", "192.168.0.1", "10.0.0.100"]
    orders = [ips, list(reversed(ips)), ips[2:] + ips[:2]]
    ranked = []
    for order in orders:
        book = WindowBook()
        for ip in order:
            book.add(_r(0, ip, 7), "final")
        ranked.append([r.ip for r in book.top(10)[0].rows])
    # Numeric address order (10.0.0.9 before 10.0.0.10), IPv4 before IPv6.
    expected = ["10.0.0.9", "10.0.0.10", "10.0.0.100", "192.168.0.1", "2001:db8::1"]
    assert ranked == [expected] * 3


def test_n_larger_than_the_ips_present_shows_them_all() -> None:
    book = WindowBook()
    book.add(_r(0, "10.0.0.1", 3), "final")
    book.add(_r(0, "10.0.0.2", 1), "final")
    (w,) = book.top(10)
    assert [(r.ip, r.count, r.share) for r in w.rows] == [
        ("10.0.0.1", 3, 0.75),
        ("10.0.0.2", 1, 0.25),
    ]


def test_late_corrections_add_to_totals_and_can_change_the_ranking() -> None:
    book = WindowBook()
    book.add(_r(0, "10.0.0.1", 5), "final")
    book.add(_r(0, "10.0.0.2", 4), "final")
    book.add(_r(0, "10.0.0.2", 2), "late")
    book.add(_r(0, "10.0.0.2", 1), "late")  # several corrections for one (window, IP) add up
    book.add(_r(0, "10.0.0.3", 2), "late")  # an IP only late records reached
    (w,) = book.top(10)
    assert (w.total, w.late, w.ips, w.final) == (14, 5, 3, True)
    assert [(r.ip, r.count, r.late) for r in w.rows] == [
        ("10.0.0.2", 7, 3),
        ("10.0.0.1", 5, 0),
        ("10.0.0.3", 2, 2),
    ]
    assert w.rows[0].share == pytest.approx(0.5)


def test_a_window_only_late_records_reached_has_no_final_result() -> None:
    book = WindowBook()
    book.add(_r(3, "10.0.0.1", 2), "late")
    (w,) = book.top(10)
    assert (w.final, w.total, w.late) == (False, 2, 2)


def test_windows_come_in_window_order_not_arrival_order() -> None:
    book = WindowBook()
    for window in (2, 0, 1):
        book.add(_r(window, "10.0.0.1", 1), "final")
    assert [w.window_start for w in book.top(1)] == [T0, T0 + W, T0 + 2 * W]


def test_the_book_keeps_only_the_newest_windows_and_counts_what_it_forgot() -> None:
    book = WindowBook(keep=2)
    for window in range(4):
        book.add(_r(window, "10.0.0.1", 1), "final")
    assert [w.window_start for w in book.top(1)] == [T0 + 2 * W, T0 + 3 * W]
    assert book.forgotten == 0
    # A correction for a window no longer kept cannot be shown with its total.
    assert book.add(_r(0, "10.0.0.1", 1), "late") is False
    assert book.forgotten == 1
    # ... nor can a final result of such a window (a partition read behind the others).
    assert book.add(_r(1, "10.0.0.2", 1), "final") is False
    assert (book.forgotten, book.forgotten_by_kind) == (2, {"final": 1, "late": 1})
    assert [w.window_start for w in book.top(1)] == [T0 + 2 * W, T0 + 3 * W]


def test_changed_since_names_the_windows_updated_after_a_mark() -> None:
    book = WindowBook()
    book.add(_r(0, "10.0.0.1", 1), "final")
    book.add(_r(1, "10.0.0.1", 1), "final")
    mark = book.seq
    book.add(_r(0, "10.0.0.1", 1), "late")
    book.add(_r(2, "10.0.0.1", 1), "final")
    assert book.changed_since(mark) == [T0, T0 + 2 * W]
    assert book.changed_since(book.seq) == []


def test_top_rows_rejects_a_nonpositive_n_and_unknown_kinds() -> None:
    with pytest.raises(ValueError, match="n must be at least 1"):
        top_rows({"10.0.0.1": 1}, {}, 0)
    with pytest.raises(ValueError, match="kind"):
        WindowBook().add(_r(0, "10.0.0.1", 1), "other")


def test_json_form_has_what_the_page_draws() -> None:
    book = WindowBook()
    book.add(_r(0, "10.0.0.1", 3), "final")
    book.add(_r(0, "10.0.0.1", 1), "late")
    assert book.top(5)[0].to_json() == {
        "window_start": T0,
        "window_end": T0 + W,
        "total": 4,
        "late": 1,
        "ips": 1,
        "final": True,
        "top": [{"ip": "10.0.0.1", "count": 4, "late": 1, "share": 1.0}],
    }
