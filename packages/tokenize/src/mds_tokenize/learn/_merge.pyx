# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
# distutils: language = c++
"""The BPE merge loop of `mds-tokenize learn`: repeatedly merges the most frequent adjacent symbol pair
over a table of (word, count), updating pair counts incrementally in the words that hold the pair.

Same algorithm as the Hugging Face `tokenizers` BpeTrainer (max-heap with lazy invalidation, pair ->
words index) and the same tie rule (smallest (left id, right id)): the merges come out identical.
"""

from cython.operator cimport dereference as deref
from libc.stdint cimport int32_t, int64_t, uint32_t, uint64_t
from libcpp.pair cimport pair
from libcpp.queue cimport priority_queue
from libcpp.unordered_map cimport unordered_map
from libcpp.vector cimport vector

# (count, ~pair key): the max-heap then yields the highest count and, among equal counts, the
# smallest pair key, i.e. the smallest (left id, right id).
ctypedef pair[int64_t, uint64_t] HeapEntry


cdef inline uint64_t pair_key(int32_t left, int32_t right) noexcept:
    return (<uint64_t><uint32_t>left << 32) | <uint32_t>right


cdef class _PairTable:
    """Pair key -> dense index, with per-pair count, the words that (may) hold it, and a stamp that
    marks the pairs whose count grew during the current merge."""
    cdef unordered_map[uint64_t, int32_t] index
    cdef vector[uint64_t] keys
    cdef vector[int64_t] counts
    cdef vector[vector[int32_t]] words
    cdef vector[int32_t] stamps
    cdef vector[int32_t] grown

    cdef int32_t find_or_add(self, uint64_t key):
        cdef pair[unordered_map[uint64_t, int32_t].iterator, bint] inserted = self.index.insert(
            pair[uint64_t, int32_t](key, <int32_t>self.counts.size()))
        if inserted.second:
            self.keys.push_back(key)
            self.counts.push_back(0)
            self.words.push_back(vector[int32_t]())
            self.stamps.push_back(-1)
        return deref(inserted.first).second

    cdef inline void decrease(self, uint64_t key, int64_t amount):
        # A pair that is being removed from a word was counted in it, so it is in the table.
        self.counts[deref(self.index.find(key)).second] -= amount

    cdef inline void increase(self, uint64_t key, int64_t amount, int32_t word, int32_t stamp):
        cdef int32_t index = self.find_or_add(key)
        self.counts[index] += amount
        # Stale entries (the word lost the pair later) are allowed; only avoid immediate repeats.
        if self.words[index].empty() or self.words[index].back() != word:
            self.words[index].push_back(word)
        if self.stamps[index] != stamp:
            self.stamps[index] = stamp
            self.grown.push_back(index)


def learn_merges(
    int32_t[::1] symbols not None,
    int64_t[::1] offsets not None,
    int64_t[::1] word_counts not None,
    list token_strings not None,
    *,
    int64_t vocab_size,
    frozenset special_tokens not None,
    int64_t min_frequency,
    progress=None,
):
    """Learns merges over words given as symbol ids: word w is `symbols[offsets[w]:offsets[w+1]]`
    (rewritten in place) and occurs `word_counts[w]` times. `token_strings[i]` is the string of
    symbol i and grows with each new token. Merging stops when the vocabulary (tokens plus the special
    tokens not already spelled by a token) reaches `vocab_size`, when the best pair occurs fewer than
    `min_frequency` times, or when no pair is left. Returns the merges as (left id, right id) and the
    number of tokens; `progress(num_merges)` is called now and then."""
    cdef int32_t num_words = word_counts.shape[0]
    cdef vector[int32_t] lengths = vector[int32_t](num_words)
    cdef vector[int32_t] word_stamps = vector[int32_t](num_words, -1)
    cdef _PairTable table = _PairTable()
    cdef priority_queue[HeapEntry] heap
    cdef vector[int32_t] todo
    cdef int32_t word, i, j, n, index, left, right, merged, stamp = 0
    cdef int64_t start, count, actual
    cdef int32_t* s
    cdef uint64_t key
    cdef HeapEntry top

    string_to_id = {string: token_id for token_id, string in enumerate(token_strings)}
    cdef int64_t num_missing_specials = sum(token not in string_to_id for token in special_tokens)
    cdef int64_t num_tokens = len(token_strings)
    merges = []

    for word in range(num_words):
        start = offsets[word]
        n = <int32_t>(offsets[word + 1] - start)
        lengths[word] = n
        for i in range(n - 1):
            table.increase(pair_key(symbols[start + i], symbols[start + i + 1]), word_counts[word], word, stamp)
    for index in range(<int32_t>table.counts.size()):
        if table.counts[index] >= min_frequency:
            heap.push(HeapEntry(table.counts[index], ~table.keys[index]))
    table.grown.clear()

    while num_tokens + num_missing_specials < vocab_size and not heap.empty():
        top = heap.top()
        heap.pop()
        key = ~top.second
        index = deref(table.index.find(key)).second
        actual = table.counts[index]
        if top.first != actual:
            # Stale: counts only shrink without a fresh push, so re-queue the lower count; an entry
            # below the actual count has a fresher twin in the heap and is dropped.
            if top.first > actual and actual >= min_frequency:
                heap.push(HeapEntry(actual, top.second))
            continue
        if actual < min_frequency:
            break
        left = <int32_t>(key >> 32)
        right = <int32_t>(key & 0xFFFFFFFF)
        new_string = token_strings[left] + token_strings[right]
        merged_id = string_to_id.get(new_string)
        if merged_id is None:
            # A merge that spells an existing token reuses its id: no duplicate vocabulary entries.
            merged_id = len(token_strings)
            token_strings.append(new_string)
            string_to_id[new_string] = merged_id
            num_tokens += 1
            if new_string in special_tokens:
                num_missing_specials -= 1
        merged = merged_id
        merges.append((left, right))

        stamp += 1
        todo.clear()
        todo.swap(table.words[index])  # the merged pair's word list is done with after this merge
        for word in todo:
            if word_stamps[word] == stamp:
                continue
            word_stamps[word] = stamp
            start = offsets[word]
            s = &symbols[start]
            n = lengths[word]
            count = word_counts[word]
            i = 0
            j = 0
            # Left to right, non-overlapping, in place (j <= i): s[j-1] is the already rewritten
            # left neighbour, s[i+2] the untouched right one, as in GPT-2's encoder.
            while i < n:
                if i + 1 < n and s[i] == left and s[i + 1] == right:
                    if j > 0:
                        table.decrease(pair_key(s[j - 1], left), count)
                        table.increase(pair_key(s[j - 1], merged), count, word, stamp)
                    if i + 2 < n:
                        table.decrease(pair_key(right, s[i + 2]), count)
                        table.increase(pair_key(merged, s[i + 2]), count, word, stamp)
                    s[j] = merged
                    i += 2
                else:
                    s[j] = s[i]
                    i += 1
                j += 1
            lengths[word] = j
        table.counts[index] = 0
        # Only pairs holding the new symbol can have grown; they need a fresh heap entry.
        for i in table.grown:
            if table.counts[i] >= min_frequency:
                heap.push(HeapEntry(table.counts[i], ~table.keys[i]))
        table.grown.clear()
        if progress is not None and (len(merges) & 63) == 0:
            progress(len(merges))
    if progress is not None:
        progress(len(merges))
    return merges, num_tokens
