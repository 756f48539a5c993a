"""The hand-curated bugs of the built-in task set, injected into the shipped ``minilib`` library.

Each bug replaces one exact snippet of a pristine file; ``python -m components.tasks.generate --curated``
turns them into ``tasks.jsonl`` (computing FAIL_TO_PASS / PASS_TO_PASS by running the hidden tests) and
``--check`` verifies the result. Problem statements describe the symptom, never the fix.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class InjectedBug:
    """One bug: in ``path``, ``original`` (which must occur exactly once) becomes ``mutated``."""

    task_id: str
    path: str
    original: str
    mutated: str
    kind: str  # off-by-one, wrong-operator, missing-edge-case, wrong-default, swapped-arguments, ...
    problem_statement: str


CURATED_BUGS: tuple[InjectedBug, ...] = (
    # ---- text ------------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-text-slugify-edges",
        path="minilib/text.py",
        original="    return slug.strip(separator)\n",
        mutated="    return slug\n",
        kind="missing-edge-case",
        problem_statement=(
            "slugify() produces slugs with stray dashes at the beginning and end when the title starts or "
            "ends with spaces or punctuation. For example slugify('  Hello, World!  ') gives "
            "'-hello-world-' and our URLs end up looking like /posts/-hello-world-. Leading and trailing "
            "separators should not be there."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-truncate-exact",
        path="minilib/text.py",
        original="    if len(text) <= max_length:\n",
        mutated="    if len(text) < max_length:\n",
        kind="off-by-one",
        problem_statement=(
            "truncate() cuts strings that already fit. truncate('exactly10!', 10) returns 'exactly...' even "
            "though the text is exactly 10 characters long and should come back unchanged."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-truncate-length",
        path="minilib/text.py",
        original="    return text[: max_length - len(ellipsis)] + ellipsis\n",
        mutated="    return text[:max_length] + ellipsis\n",
        kind="off-by-one",
        problem_statement=(
            "truncate(text, 10) returns strings longer than 10 characters: truncate('a fairly long "
            "sentence', 10) gives 'a fairly l...' (13 characters). Our UI column overflows. The result "
            "should never be longer than max_length, ellipsis included."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-wrap-width",
        path="minilib/text.py",
        original="        elif len(current) + 1 + len(word) <= width:\n",
        mutated="        elif len(current) + 1 + len(word) < width:\n",
        kind="wrong-comparison",
        problem_statement=(
            "wrap() breaks lines too early. wrap('aaaa bbbb cccc', 9) returns ['aaaa', 'bbbb', 'cccc'] but "
            "'aaaa bbbb' is exactly 9 characters and fits on one line."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-wordcount-case",
        path="minilib/text.py",
        original='    for word in re.findall(r"[a-z0-9\']+", text.lower()):\n',
        mutated='    for word in re.findall(r"[a-z0-9\']+", text):\n',
        kind="missing-edge-case",
        problem_statement=(
            "word_count() is supposed to be case-insensitive, but capitalised words are dropped or "
            "mangled: word_count('The cat and the hat. THE end') does not count 'the' three times and "
            "some words are missing entirely from the result."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-camel-acronyms",
        path="minilib/text.py",
        original='    name = re.sub(r"(?<=[A-Z])(?=[A-Z][a-z])", "_", name)\n',
        mutated="",
        kind="missing-edge-case",
        problem_statement=(
            "camel_to_snake() mishandles acronyms: camel_to_snake('parseHTTPResponse') returns "
            "'parse_httpresponse' instead of 'parse_http_response', and 'XMLParser' becomes 'xmlparser'."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-camel-default",
        path="minilib/text.py",
        original="def snake_to_camel(name: str, upper_first: bool = False) -> str:\n",
        mutated="def snake_to_camel(name: str, upper_first: bool = True) -> str:\n",
        kind="wrong-default",
        problem_statement=(
            "snake_to_camel('parse_http_response') returns 'ParseHttpResponse', but the docstring (and "
            "everyone calling it) expects lower camelCase 'parseHttpResponse' unless upper_first is asked for."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-palindrome-case",
        path="minilib/text.py",
        original="    cleaned = [char.lower() for char in text if char.isalnum()]\n",
        mutated="    cleaned = [char for char in text if char.isalnum()]\n",
        kind="missing-edge-case",
        problem_statement=(
            "is_palindrome('Racecar') returns False, and so does 'A man, a plan, a canal: Panama'. Case "
            "should not matter."
        ),
    ),
    InjectedBug(
        task_id="minilib-text-prefix-short-word",
        path="minilib/text.py",
        original="        while index < min(len(prefix), len(word)) and prefix[index] == word[index]:\n",
        mutated="        while index < len(prefix) and prefix[index] == word[index]:\n",
        kind="missing-edge-case",
        problem_statement=(
            "common_prefix(['abc', 'ab']) crashes with IndexError: string index out of range. It should "
            "return 'ab'. It seems to happen whenever a later word is a prefix of the first one."
        ),
    ),
    # ---- intervals -------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-intervals-contains-end",
        path="minilib/intervals.py",
        original="        return self.start <= point < self.end\n",
        mutated="        return self.start <= point <= self.end\n",
        kind="wrong-comparison",
        problem_statement=(
            "Interval(0, 10).contains(10) returns True, but intervals are documented as half-open "
            "[start, end), so the end point must not be contained. This double-books adjacent time slots."
        ),
    ),
    InjectedBug(
        task_id="minilib-intervals-overlap-touching",
        path="minilib/intervals.py",
        original="        return self.start < other.end and other.start < self.end\n",
        mutated="        return self.start <= other.end and other.start <= self.end\n",
        kind="wrong-comparison",
        problem_statement=(
            "Back-to-back intervals are reported as overlapping: Interval(0, 5).overlaps(Interval(5, 8)) "
            "is True, and their intersection comes back as an empty Interval(5, 5) instead of None."
        ),
    ),
    InjectedBug(
        task_id="minilib-intervals-merge-touching",
        path="minilib/intervals.py",
        original="        if result and interval.start <= result[-1].end:\n",
        mutated="        if result and interval.start < result[-1].end:\n",
        kind="wrong-comparison",
        problem_statement=(
            "merge([Interval(0, 2), Interval(2, 4)]) returns two intervals instead of one Interval(0, 4). "
            "The docstring says touching intervals are merged too."
        ),
    ),
    InjectedBug(
        task_id="minilib-intervals-merge-nested",
        path="minilib/intervals.py",
        original="            result[-1] = Interval(last.start, max(last.end, interval.end))\n",
        mutated="            result[-1] = Interval(last.start, interval.end)\n",
        kind="missing-edge-case",
        problem_statement=(
            "merge() loses coverage when one interval lies inside another: merge([Interval(0, 10), "
            "Interval(2, 3)]) returns [Interval(0, 3)] instead of [Interval(0, 10)]."
        ),
    ),
    InjectedBug(
        task_id="minilib-intervals-empty-rejected",
        path="minilib/intervals.py",
        original="        if self.end < self.start:\n",
        mutated="        if self.end <= self.start:\n",
        kind="wrong-comparison",
        problem_statement=(
            "Creating an empty interval such as Interval(4, 4) raises ValueError ('end 4 is before start "
            "4'), although empty intervals are supposed to be allowed (is_empty() exists for them)."
        ),
    ),
    InjectedBug(
        task_id="minilib-intervals-total-double-count",
        path="minilib/intervals.py",
        original="    return sum(interval.length for interval in merge(intervals))\n",
        mutated="    return sum(interval.length for interval in intervals)\n",
        kind="missing-edge-case",
        problem_statement=(
            "total_length() counts overlapping parts twice: total_length([Interval(0, 4), Interval(2, 6), "
            "Interval(10, 11)]) returns 9, but the union only covers 7."
        ),
    ),
    InjectedBug(
        task_id="minilib-intervals-gaps-tail",
        path="minilib/intervals.py",
        original="    if cursor < within.end:\n        result.append(Interval(cursor, within.end))\n",
        mutated="",
        kind="missing-edge-case",
        problem_statement=(
            "gaps() never reports the free time at the end of the range: gaps([Interval(0, 3)], "
            "Interval(0, 5)) returns [] instead of [Interval(3, 5)], and with no intervals at all it says "
            "the whole range is busy."
        ),
    ),
    # ---- durations -------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-durations-fractional",
        path="minilib/durations.py",
        original='_PART = re.compile(r"(\\d+(?:\\.\\d+)?)\\s*([wdhms])")\n',
        mutated='_PART = re.compile(r"(\\d+)\\s*([wdhms])")\n',
        kind="missing-edge-case",
        problem_statement=(
            "parse_duration('1.5h') raises ValueError: cannot parse duration '1.5h'. Fractional amounts "
            "like '1.5h' or '0.5m' used to work and are in our config files."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-clock-sixty",
        path="minilib/durations.py",
        original="    if any(number >= 60 for number in numbers[1:]):\n",
        mutated="    if any(number > 60 for number in numbers[1:]):\n",
        kind="off-by-one",
        problem_statement=(
            "parse_duration('1:60') is accepted and returns 120 seconds; clock-style durations with 60 "
            "minutes or seconds should be rejected with ValueError like other invalid values."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-format-days",
        path="minilib/durations.py",
        original='    for unit in ("d", "h", "m", "s"):\n',
        mutated='    for unit in ("h", "m", "s"):\n',
        kind="missing-edge-case",
        problem_statement=(
            "format_duration(90000) shows '25h' instead of '1d 1h'. Long durations are never shown in "
            "days, which makes our job dashboard hard to read."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-format-zero",
        path="minilib/durations.py",
        original='    return " ".join(parts) if parts else "0s"\n',
        mutated='    return " ".join(parts)\n',
        kind="missing-edge-case",
        problem_statement=(
            "format_duration(0) returns an empty string, so our table shows a blank cell for jobs that "
            "took no time. It should say '0s' as documented."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-leap-400",
        path="minilib/durations.py",
        original="    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n",
        mutated="    return year % 4 == 0 and year % 100 != 0\n",
        kind="missing-edge-case",
        problem_statement=(
            "is_leap_year(2000) returns False, so parse_date('2000-02-29') is rejected as out of range. "
            "2000 was a leap year."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-days-in-month-index",
        path="minilib/durations.py",
        original="    return _DAYS_IN_MONTH[month - 1]\n",
        mutated="    return _DAYS_IN_MONTH[month]\n",
        kind="off-by-one",
        problem_statement=(
            "days_in_month() gives wrong answers: days_in_month(2023, 1) is 28 and days_in_month(2023, 12) "
            "raises IndexError. Date parsing fails for many valid dates as a result."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-day-of-year",
        path="minilib/durations.py",
        original="    return sum(days_in_month(year, m) for m in range(1, month)) + day\n",
        mutated="    return sum(days_in_month(year, m) for m in range(1, month + 1)) + day\n",
        kind="off-by-one",
        problem_statement=(
            "day_of_year(2023, 1, 1) returns 32 instead of 1; every result is a month too late."
        ),
    ),
    InjectedBug(
        task_id="minilib-durations-add-days-backward",
        path="minilib/durations.py",
        original=(
            "        month -= 1\n"
            "        if month < 1:\n"
            "            month, year = 12, year - 1\n"
            "        day += days_in_month(year, month)\n"
        ),
        mutated=(
            "        day += days_in_month(year, month)\n"
            "        month -= 1\n"
            "        if month < 1:\n"
            "            month, year = 12, year - 1\n"
        ),
        kind="wrong-order",
        problem_statement=(
            "Subtracting days across a month boundary gives impossible dates: add_days((2024, 3, 1), -1) "
            "returns (2024, 2, 31) instead of (2024, 2, 29). Adding positive days works fine."
        ),
    ),
    # ---- stats -----------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-stats-median-unsorted",
        path="minilib/stats.py",
        original="    ordered = sorted(values)\n    middle = len(ordered) // 2\n",
        mutated="    ordered = list(values)\n    middle = len(ordered) // 2\n",
        kind="missing-edge-case",
        problem_statement=(
            "median([9, 1, 5]) returns 1. It looks right only when the input happens to be sorted already."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-mode-tie",
        path="minilib/stats.py",
        original="    for value in values:\n        if counts[value] == best:\n",
        mutated="    for value in sorted(values):\n        if counts[value] == best:\n",
        kind="wrong-tie-break",
        problem_statement=(
            "mode([3, 1, 3, 1]) returns 1, but the docstring promises ties go to the value seen first, "
            "which is 3."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-variance-default",
        path="minilib/stats.py",
        original="def variance(values: list[float], sample: bool = True) -> float:\n",
        mutated="def variance(values: list[float], sample: bool = False) -> float:\n",
        kind="wrong-default",
        problem_statement=(
            "variance([2, 4, 4, 4, 5, 5, 7, 9]) returns 4.0, the population variance, although the "
            "function is documented to compute the sample variance (32/7) unless sample=False is passed. "
            "variance([1]) also no longer raises."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-percentile-top",
        path="minilib/stats.py",
        original="    upper = min(lower + 1, len(ordered) - 1)\n",
        mutated="    upper = lower + 1\n",
        kind="missing-edge-case",
        problem_statement=(
            "percentile(values, 100) raises IndexError: list index out of range. Other percentiles seem fine."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-percentile-rank",
        path="minilib/stats.py",
        original="    rank = (len(ordered) - 1) * q / 100\n",
        mutated="    rank = len(ordered) * q / 100\n",
        kind="off-by-one",
        problem_statement=(
            "percentile() returns values that are too high: percentile([1, 2, 3, 4], 50) gives 3 instead of "
            "the median 2.5, and percentile([10, 20, 30, 40, 50], 25) gives 30 instead of 20."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-normalize-range",
        path="minilib/stats.py",
        original="    return [(value - low) / (high - low) for value in values]\n",
        mutated="    return [(value - low) / high for value in values]\n",
        kind="wrong-operand",
        problem_statement=(
            "normalize([2, 4, 6]) returns [0.0, 0.333..., 0.666...]; the largest value should map to 1.0."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-moving-average-full-window",
        path="minilib/stats.py",
        original="    if window > len(values):\n",
        mutated="    if window >= len(values):\n",
        kind="off-by-one",
        problem_statement=(
            "moving_average([2, 4, 6], 3) returns [] but a window as long as the data should give one "
            "average, [4.0]."
        ),
    ),
    InjectedBug(
        task_id="minilib-stats-moving-average-drift",
        path="minilib/stats.py",
        original="        total += values[index] - values[index - window]\n",
        mutated="        total += values[index] - values[index - window + 1]\n",
        kind="off-by-one",
        problem_statement=(
            "moving_average([1, 2, 3, 10], 3) returns [2.0, 4.333...] but the second window is 2, 3, 10 "
            "whose mean is 5.0. The first value is always right, later ones drift."
        ),
    ),
    # ---- lru -------------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-lru-get-recency",
        path="minilib/lru.py",
        original="        self.hits += 1\n        self._items.move_to_end(key)\n",
        mutated="        self.hits += 1\n",
        kind="missing-edge-case",
        problem_statement=(
            "LRUCache behaves like a FIFO: reading a key with get() does not protect it from eviction. "
            "After put a, put b, get a, put c on a cache of size 2, 'a' has been evicted instead of 'b'."
        ),
    ),
    InjectedBug(
        task_id="minilib-lru-update-recency",
        path="minilib/lru.py",
        original="        if key in self._items:\n            self._items.move_to_end(key)\n        self._items[key] = value\n",
        mutated="        self._items[key] = value\n",
        kind="missing-edge-case",
        problem_statement=(
            "Updating an existing key in LRUCache with put() does not count as a use: the freshly updated "
            "entry is the next one evicted, so get() returns None for a value we just wrote."
        ),
    ),
    InjectedBug(
        task_id="minilib-lru-evicts-newest",
        path="minilib/lru.py",
        original="            self._items.popitem(last=False)\n",
        mutated="            self._items.popitem()\n",
        kind="wrong-argument",
        problem_statement=(
            "When the LRUCache is full, putting a new item evicts that same new item instead of the "
            "oldest one: after putting 'a', 'b', 'c' into a cache of size 2, 'c' is not in the cache."
        ),
    ),
    InjectedBug(
        task_id="minilib-lru-capacity-off-by-one",
        path="minilib/lru.py",
        original="        while len(self._items) > size:\n",
        mutated="        while len(self._items) >= size:\n",
        kind="off-by-one",
        problem_statement=(
            "LRUCache(3) never holds more than 2 items, and the evictions counter is too high. A cache "
            "of capacity 1 is always empty after put()."
        ),
    ),
    InjectedBug(
        task_id="minilib-lru-resize-no-evict",
        path="minilib/lru.py",
        original="        self.capacity = capacity\n        self._evict_to(capacity)\n",
        mutated="        self.capacity = capacity\n",
        kind="missing-edge-case",
        problem_statement=(
            "Shrinking an LRUCache with resize() keeps all existing items: after resize(2) on a full "
            "cache of 4, len(cache) is still 4."
        ),
    ),
    # ---- roman -----------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-roman-ninety",
        path="minilib/roman.py",
        original='    (90, "XC"),\n',
        mutated="",
        kind="missing-edge-case",
        problem_statement=(
            "to_roman(90) returns 'LXXXX' instead of 'XC', and from_roman('XCIX') raises ValueError "
            "saying it is not canonical."
        ),
    ),
    InjectedBug(
        task_id="minilib-roman-repeated-symbols",
        path="minilib/roman.py",
        original="        if index + 1 < len(numeral) and value < _VALUES[numeral[index + 1]]:\n",
        mutated="        if index + 1 < len(numeral) and value <= _VALUES[numeral[index + 1]]:\n",
        kind="wrong-comparison",
        problem_statement=(
            "from_roman('III') raises ValueError ('not a canonical roman numeral'), as does 'MMXX'. "
            "Numerals with repeated symbols cannot be parsed at all."
        ),
    ),
    InjectedBug(
        task_id="minilib-roman-upper-limit",
        path="minilib/roman.py",
        original="    if not 1 <= number <= 3999:\n",
        mutated="    if not 1 <= number < 3999:\n",
        kind="off-by-one",
        problem_statement="to_roman(3999) raises ValueError, although 3999 (MMMCMXCIX) is in the supported range.",
    ),
    InjectedBug(
        task_id="minilib-roman-lowercase",
        path="minilib/roman.py",
        original="    numeral = numeral.strip().upper()\n",
        mutated="    numeral = numeral.strip()\n",
        kind="missing-edge-case",
        problem_statement="from_roman('xiv') raises ValueError; lower-case numerals should be accepted.",
    ),
    # ---- iterutils -------------------------------------------------------------------------------------
    InjectedBug(
        task_id="minilib-iter-chunked-tail",
        path="minilib/iterutils.py",
        original="    if chunk:\n        yield chunk\n",
        mutated="",
        kind="missing-edge-case",
        problem_statement=(
            "chunked(range(5), 2) yields [[0, 1], [2, 3]]; the last item 4 is silently lost. We lose "
            "records when batching uploads."
        ),
    ),
    InjectedBug(
        task_id="minilib-iter-window-last",
        path="minilib/iterutils.py",
        original="range(0, len(items) - size + 1, step)",
        mutated="range(0, len(items) - size, step)",
        kind="off-by-one",
        problem_statement=(
            "sliding_window([1, 2, 3, 4], 2) returns [(1, 2), (2, 3)], missing the final window (3, 4); "
            "sliding_window([1, 2, 3], 3) returns nothing."
        ),
    ),
    InjectedBug(
        task_id="minilib-iter-flatten-tuples",
        path="minilib/iterutils.py",
        original="        if isinstance(item, (list, tuple)):\n",
        mutated="        if isinstance(item, list):\n",
        kind="missing-edge-case",
        problem_statement=(
            "flatten() leaves tuples nested: flatten([(1, 2), ['ab', ('c',)]]) returns "
            "[(1, 2), 'ab', ('c',)] instead of [1, 2, 'ab', 'c']."
        ),
    ),
    InjectedBug(
        task_id="minilib-iter-unique-key",
        path="minilib/iterutils.py",
        original="            seen.add(marker)\n",
        mutated="            seen.add(item)\n",
        kind="wrong-variable",
        problem_statement=(
            "unique(..., key=str.lower) ignores the key: unique(['Apple', 'apple', 'Banana', 'APPLE'], "
            "key=str.lower) returns all four items instead of ['Apple', 'Banana']."
        ),
    ),
)
