"""`verify`'s join on relative paths, judged a part of the paths at a time.

Every row of a path (its sources, its records, its lines in rejected/) must be in before the
path is judged, so the judging comes once the workers are done; in the launcher alone it
was a seventh of a run on two cores, and would be most of one on many (RESULTS.md, "fewer
steps an input"). Each path's rows go into the sort of the part `part_of` names (`Parts`),
one part a process: the workers sort the rows they make (a shard's, a batch of sources')
into runs the launcher adopts, so that the launcher never holds them. The launcher judges
the first part itself, and each worker another (`judge_part`), handing back what the
launcher joins next: the problems, the content rows (files of sorted runs), the rows of the
paths still waiting for a source to be checked on its own, and those sources.
"""

from __future__ import annotations

import itertools
import operator
import zlib
from collections.abc import Iterable, Iterator

from beam_jobs import spill
from beam_jobs.source_file import SourceFile
from tfrecord_pipe._tools import verify_beside
from tfrecord_pipe._tools import verify_rules as rules
from tfrecord_pipe._tools.verify_rules import INPUTS, RECORD, REJECTED, REPORTED, SOURCE

LISTED = "listed"  # a source listed, to be paired with one checked beside its record
FOUND, PAIR = verify_beside.FOUND, verify_beside.PAIR
# Within a key, for the joins.
ORDER = {SOURCE: 0, RECORD: 1, REJECTED: 2, REPORTED: 3, LISTED: 4, FOUND: 5, PAIR: 6}
PATH_KINDS = frozenset(ORDER) - {REPORTED}  # the kinds of rows joined on paths (REPORTED: content)
# Parts at most, whatever the number of processes: each part's sort holds its share of
# RUN_ITEMS, and more parts would write ever more, smaller runs (2,048 rows at 16).
MOST_PARTS = 16
# The sorts' keys: a path's rows (relpath, order, kind, row); a content's (sha256, order, row).
BY_PATH = BY_CONTENT = operator.itemgetter(0, 1)


def part_of(relpath: str, parts: int) -> int:
    """The part a path's rows go to, the same in every process (Python's own hash of a str
    differs between processes)."""
    return zlib.crc32(relpath.encode("utf-8", "surrogatepass")) % parts


class Parts:
    """Rows of paths, each into the sort of its path's part (`part_of`): filled in the
    launcher, and in each worker for the rows it makes, whose runs the launcher adopts."""

    def __init__(self, work: str, parts: int, run_items: int):
        self.sorts = [spill.SortedSpill(work, key=BY_PATH, run_items=run_items)
                      for _ in range(parts)]  # fmt: skip

    def add(self, relpath: str, kind: str, row) -> None:
        self.sorts[part_of(relpath, len(self.sorts))].add((relpath, ORDER[kind], kind, row))

    def handed_over(self) -> list[list[str]]:
        """Each part's runs (`spill.SortedSpill.handed_over`), for `adopt`."""
        return [part.handed_over() for part in self.sorts]

    def adopt(self, runs: list[list[str]]) -> None:
        """Another's parts' runs (`handed_over`), as rows added before those held here."""
        for part, part_runs in zip(self.sorts, runs, strict=True):
            part.adopt(part_runs)


class Problems:
    """All problems counted; the first MAX_PROBLEMS_KEPT in order kept, in bounded memory."""

    def __init__(self):
        self._ranked: list[tuple[int, str]] = []
        self.count = 0

    def add(self, text: str, rank: int = INPUTS) -> None:
        self.count += 1
        self._ranked.append((rank, text))
        if len(self._ranked) >= 2 * rules.MAX_PROBLEMS_KEPT:
            self._ranked = sorted(self._ranked)[: rules.MAX_PROBLEMS_KEPT]

    def extend(self, texts: Iterable[str], rank: int = INPUTS) -> None:
        for text in texts:
            self.add(text, rank)

    def handed_over(self) -> tuple[list[tuple[int, str]], int]:
        """(the first MAX_PROBLEMS_KEPT (rank, text) pairs, the count), for `take`."""
        return sorted(self._ranked)[: rules.MAX_PROBLEMS_KEPT], self.count

    def take(self, handed: tuple[list[tuple[int, str]], int]) -> None:
        """Another's problems (`handed_over`): the same as had they been added here."""
        ranked, count = handed
        for rank, text in ranked:
            self.add(text, rank)
        self.count += count - len(ranked)

    @property
    def kept(self) -> list[str]:
        return rules.first_problems(self._ranked)


class PathJudge:
    """Judges paths from their rows, each path's together, into `problems` and the rows of
    the join on content (`content`: (sha256, order, row)); a path whose listed sources were
    not all checked waits in `later` ((relpath, order, kind, row)) for their rows."""

    def __init__(self, problems: Problems, content: spill.SortedSpill, later: spill.SortedSpill):
        self.problems = problems
        self.content = content
        self.later = later

    def match(self, rows: Iterable[tuple], dedupe: bool) -> Iterator[SourceFile]:
        """Judges each path whose sources are all checked, from its rows in path order
        (SOURCE rows checked on their own; LISTED sources and FOUND rows of those checked
        beside their records, PAIR items holding a record's row and its source's); gives
        the listed sources no FOUND row speaks for (their path's rows wait in `later`)."""
        for relpath, same in itertools.groupby(rows, key=operator.itemgetter(0)):
            same = list(same)
            if len(same) == 2:  # the usual: a source and its record, checked apart or beside
                (_, _, first_kind, first), (_, _, second_kind, second) = same
                if first_kind == SOURCE and second_kind == RECORD and "rejected" not in first:
                    self.judge_pair(relpath, first, second)
                    continue
                if first_kind == LISTED and second_kind == PAIR:
                    record, found = second
                    if "rejected" not in found and verify_beside.same_source(first, found):
                        self.judge_pair(relpath, found, record)
                        continue
            rows_of = {SOURCE: [], RECORD: [], REJECTED: [], LISTED: [], FOUND: [], PAIR: []}
            for _, _, kind, row in same:
                rows_of[kind].append(row)
            for record, found in rows_of.pop(PAIR):
                rows_of[RECORD].append(record)
                rows_of[FOUND].append(found)
            left = []
            for listed in rows_of.pop(LISTED):
                at = next((i for i, found in enumerate(rows_of[FOUND])
                           if verify_beside.same_source(listed, found)), None)  # fmt: skip
                if at is None:
                    left.append(SourceFile(listed[0], relpath, *listed[1:]))
                else:
                    rows_of[SOURCE].append(rows_of[FOUND].pop(at))
            del rows_of[FOUND]  # found beside a record, but not listed so: not a source
            if not left:
                self.judge(relpath, rows_of, dedupe)
                continue
            for kind, kind_rows in rows_of.items():
                for row in kind_rows:
                    self.later.add((relpath, ORDER[kind], kind, row))
            yield from left

    def judge_pair(self, relpath: str, source: dict, record: dict) -> None:
        """`judge` of one source the converter stores and its record (`rules.check_pair`)."""
        problems, (sha256, row) = rules.check_pair(relpath, source, record)
        if problems:
            self.problems.extend(problems)
        self.content.add((sha256, ORDER[SOURCE], row))

    def judge(self, relpath: str, rows: dict[str, list[dict]], dedupe: bool) -> None:
        self.problems.extend(rules.check_path(relpath, rows, dedupe))
        content = rules.content_row(relpath, rows)
        if content is not None:
            self.content.add((content[0], ORDER[SOURCE], content[1]))


def judge_part(work: str, runs: list[str], dedupe: bool, run_items: int) -> tuple:
    """A worker's part: the paths whose rows are in these sorted runs (`spill.SortedSpill.
    handed_over`), judged, holding at most `run_items` rows a sort (the launcher's share a
    part). Returns (its problems handed over, the content rows' runs, the waiting paths'
    rows' runs, a file of the sources left to check: `spill.read_items`)."""
    rows = spill.SortedSpill(work, key=BY_PATH)
    rows.adopt(runs)
    judge = PathJudge(Problems(), spill.SortedSpill(work, key=BY_CONTENT, run_items=run_items),
                      spill.SortedSpill(work, key=BY_PATH, run_items=run_items))  # fmt: skip
    left = spill.write_file(work, judge.match(rows.sorted(), dedupe), ".left")
    return (judge.problems.handed_over(), judge.content.handed_over(),
            judge.later.handed_over(), left)  # fmt: skip
