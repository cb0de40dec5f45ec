# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The encoder's hot path: GPT-2 pretokenizer scan, byte-level BPE merge loop and a per-word id cache.

The scan reproduces `byte_level.GPT2_SPLIT_PATTERN` as the `regex` module applies it (findall, left
to right, `\\s+(?!\\S)` backtracking included); the merge loop is Megatron's `bpe()` (lowest-ranked
pair first, every occurrence merged left to right per round). Symbols arrive interned by tokenizer.py.
"""

from cpython.unicode cimport PyUnicode_DATA, PyUnicode_GET_LENGTH, PyUnicode_KIND
from libc.stdint cimport int32_t, int64_t, uint8_t, uint16_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc, realloc
from libc.string cimport memcmp, memcpy, memset

import numpy as np

# Character classes of the pattern; the 0x110000-entry table comes from unicode_classes.py.
cdef enum:
    CLS_OTHER = 0
    CLS_LETTER = 1
    CLS_NUMBER = 2
    CLS_SPACE = 3
    # Longer words are rare and seldom repeat; caching them would only churn the arenas.
    MAX_CACHED_WORD_BYTES = 256
    # From this length the merge loop uses a heap (n log n) instead of rescanning every round (n^2):
    # a 1 MB base64 blob or run of one letter must not stall a worker for minutes.
    HEAP_MERGE_MIN_BYTES = 128

cdef uint32_t NO_RANK = 0xFFFFFFFFu
cdef uint64_t EMPTY_KEY = 0xFFFFFFFFFFFFFFFFull
cdef uint64_t FNV_OFFSET = 14695981039346656037ull
cdef uint64_t FNV_PRIME = 1099511628211ull

ctypedef fused char_t:
    uint8_t
    uint16_t
    uint32_t


cdef struct PairEntry:
    uint32_t rank
    Py_ssize_t position  # node index of the left symbol
    uint32_t left
    uint32_t right


cdef inline bint _before(PairEntry* a, PairEntry* b) noexcept nogil:
    return a.rank < b.rank or (a.rank == b.rank and a.position < b.position)


cdef void _heap_push(PairEntry* heap, Py_ssize_t* size, PairEntry entry) noexcept nogil:
    cdef Py_ssize_t child = size[0], parent
    size[0] += 1
    while child > 0:
        parent = (child - 1) >> 1
        if not _before(&entry, &heap[parent]):
            break
        heap[child] = heap[parent]
        child = parent
    heap[child] = entry


cdef PairEntry _heap_pop(PairEntry* heap, Py_ssize_t* size) noexcept nogil:
    cdef PairEntry top = heap[0], last
    cdef Py_ssize_t parent = 0, child
    size[0] -= 1
    last = heap[size[0]]
    while True:
        child = 2 * parent + 1
        if child >= size[0]:
            break
        if child + 1 < size[0] and _before(&heap[child + 1], &heap[child]):
            child += 1
        if not _before(&heap[child], &last):
            break
        heap[parent] = heap[child]
        parent = child
    heap[parent] = last
    return top


cdef struct CacheEntry:
    uint64_t hash
    uint32_t key_offset
    uint32_t ids_offset
    uint16_t key_len
    uint16_t ids_len  # 0 marks an empty slot: every word yields at least one id


cdef inline uint64_t _mix(uint64_t key) nogil:
    key ^= key >> 33
    key *= 0xFF51AFD7ED558CCDull
    key ^= key >> 33
    return key


cdef class BPECore:
    """Merge table, symbol -> id map and word cache; `encode_batch` is the entry point."""

    cdef object _classes_ref
    cdef const uint8_t* classes
    cdef uint32_t byte_symbol[256]
    cdef int32_t* symbol_id
    cdef Py_ssize_t num_symbols
    # merge table: open addressing on (left << 32 | right)
    cdef uint64_t* merge_keys
    cdef uint32_t* merge_rank
    cdef uint32_t* merge_result
    cdef uint64_t merge_mask
    # word cache
    cdef CacheEntry* entries
    cdef uint64_t cache_mask
    cdef Py_ssize_t cache_count
    cdef Py_ssize_t cache_limit
    cdef uint8_t* key_arena
    cdef size_t key_used
    cdef size_t key_capacity
    cdef uint32_t* ids_arena
    cdef size_t ids_used
    cdef size_t ids_capacity
    # output ids of the current call
    cdef uint32_t* out
    cdef size_t out_len
    cdef size_t out_capacity
    # scratch for one word: its UTF-8 bytes and the merge loop's arrays
    cdef uint8_t* word
    cdef uint32_t* syms
    cdef uint32_t* ranks
    cdef uint32_t* results
    cdef Py_ssize_t* source
    cdef uint8_t* merged
    cdef Py_ssize_t word_capacity
    cdef bint bad_char
    cdef list spans

    def __cinit__(self):
        self.symbol_id = NULL
        self.merge_keys = NULL
        self.merge_rank = NULL
        self.merge_result = NULL
        self.entries = NULL
        self.key_arena = NULL
        self.ids_arena = NULL
        self.out = NULL
        self.word = NULL
        self.syms = NULL
        self.ranks = NULL
        self.results = NULL
        self.source = NULL
        self.merged = NULL
        self.spans = None

    def __init__(self, *, bytes classes, byte_symbols, symbol_ids, merges, Py_ssize_t cache_words=1 << 18):
        """classes: one class byte per code point; byte_symbols: symbol of each byte value;
        symbol_ids: vocab id of each symbol; merges: (left, right, result) symbols in rank order."""
        cdef Py_ssize_t i, capacity
        cdef uint64_t key, slot
        if len(classes) != 0x110000:
            raise ValueError("classes must hold one byte per code point")
        self._classes_ref = classes
        self.classes = <const uint8_t*> (<char*> classes)
        for i in range(256):
            self.byte_symbol[i] = byte_symbols[i]
        self.num_symbols = len(symbol_ids)
        self.symbol_id = <int32_t*> malloc(max(self.num_symbols, 1) * sizeof(int32_t))
        for i in range(self.num_symbols):
            self.symbol_id[i] = symbol_ids[i]
        capacity = 16
        while capacity < 2 * len(merges):
            capacity *= 2
        self.merge_mask = capacity - 1
        self.merge_keys = <uint64_t*> malloc(capacity * sizeof(uint64_t))
        self.merge_rank = <uint32_t*> malloc(capacity * sizeof(uint32_t))
        self.merge_result = <uint32_t*> malloc(capacity * sizeof(uint32_t))
        memset(self.merge_keys, 0xFF, capacity * sizeof(uint64_t))
        for i, (left, right, result) in enumerate(merges):
            key = (<uint64_t> left << 32) | <uint64_t> right
            slot = _mix(key) & self.merge_mask
            while self.merge_keys[slot] != EMPTY_KEY and self.merge_keys[slot] != key:
                slot = (slot + 1) & self.merge_mask
            # A repeated pair takes its last rank, as Megatron's dict(zip(merges, range(...))).
            self.merge_keys[slot] = key
            self.merge_rank[slot] = i
            self.merge_result[slot] = result
        capacity = 16
        while capacity < 2 * cache_words:
            capacity *= 2
        self.cache_mask = capacity - 1
        self.cache_limit = cache_words
        self.entries = <CacheEntry*> calloc(capacity, sizeof(CacheEntry))
        self.key_capacity = 4 << 20
        self.key_arena = <uint8_t*> malloc(self.key_capacity)
        self.ids_capacity = 1 << 20
        self.ids_arena = <uint32_t*> malloc(self.ids_capacity * sizeof(uint32_t))
        self.out_capacity = 1 << 16
        self.out = <uint32_t*> malloc(self.out_capacity * sizeof(uint32_t))
        self._reserve_word(1024)
        if (self.symbol_id == NULL or self.merge_keys == NULL or self.merge_rank == NULL
                or self.merge_result == NULL or self.entries == NULL or self.key_arena == NULL
                or self.ids_arena == NULL or self.out == NULL):
            raise MemoryError()

    def __dealloc__(self):
        free(self.symbol_id)
        free(self.merge_keys)
        free(self.merge_rank)
        free(self.merge_result)
        free(self.entries)
        free(self.key_arena)
        free(self.ids_arena)
        free(self.out)
        free(self.word)
        free(self.syms)
        free(self.ranks)
        free(self.results)
        free(self.source)
        free(self.merged)

    # ---------------------------------------------------------------- buffers

    cdef int _reserve_word(self, Py_ssize_t num_bytes) except -1:
        cdef Py_ssize_t capacity
        if num_bytes <= self.word_capacity:
            return 0
        capacity = max(num_bytes, 2 * self.word_capacity)
        self.word = <uint8_t*> _grow(self.word, capacity)
        self.syms = <uint32_t*> _grow(self.syms, capacity * sizeof(uint32_t))
        self.ranks = <uint32_t*> _grow(self.ranks, capacity * sizeof(uint32_t))
        self.results = <uint32_t*> _grow(self.results, capacity * sizeof(uint32_t))
        self.source = <Py_ssize_t*> _grow(self.source, capacity * sizeof(Py_ssize_t))
        self.merged = <uint8_t*> _grow(self.merged, capacity)
        self.word_capacity = capacity
        return 0

    cdef inline int _reserve_out(self, size_t extra) except -1:
        if self.out_len + extra <= self.out_capacity:
            return 0
        while self.out_len + extra > self.out_capacity:
            self.out_capacity *= 2
        self.out = <uint32_t*> _grow(self.out, self.out_capacity * sizeof(uint32_t))
        return 0

    cdef void _clear_cache(self) noexcept:
        memset(self.entries, 0, (self.cache_mask + 1) * sizeof(CacheEntry))
        self.cache_count = 0
        self.key_used = 0
        self.ids_used = 0

    # ---------------------------------------------------------------- BPE

    cdef inline uint32_t _rank(self, uint32_t left, uint32_t right, uint32_t* result) noexcept:
        cdef uint64_t key = (<uint64_t> left << 32) | <uint64_t> right
        cdef uint64_t slot = _mix(key) & self.merge_mask
        cdef uint64_t found
        while True:
            found = self.merge_keys[slot]
            if found == key:
                result[0] = self.merge_result[slot]
                return self.merge_rank[slot]
            if found == EMPTY_KEY:
                return NO_RANK
            slot = (slot + 1) & self.merge_mask

    cdef Py_ssize_t _bpe_heap(self, Py_ssize_t num_bytes) except -1:
        """Same result as _bpe for long words: a linked list of symbols and a heap of pairs keyed
        (rank, position). A round pops every entry of the lowest rank (one pair: ranks are unique)
        and merges them left to right; entries that went stale are recognised because a node's
        symbol only ever grows, so an entry whose two symbols still match is current."""
        cdef Py_ssize_t n = num_bytes, i, size = 0, num_round, num_merged, p, q
        cdef uint32_t* syms = <uint32_t*> malloc(n * sizeof(uint32_t))
        cdef Py_ssize_t* next_node = <Py_ssize_t*> malloc(n * sizeof(Py_ssize_t))
        cdef Py_ssize_t* prev_node = <Py_ssize_t*> malloc(n * sizeof(Py_ssize_t))
        cdef Py_ssize_t* merged_nodes = <Py_ssize_t*> malloc(n * sizeof(Py_ssize_t))
        # n - 1 initial pairs plus at most two new pairs per merge (fewer than n merges).
        cdef PairEntry* heap = <PairEntry*> malloc(3 * n * sizeof(PairEntry))
        cdef PairEntry* round_entries = <PairEntry*> malloc(3 * n * sizeof(PairEntry))
        cdef PairEntry entry
        cdef uint32_t rank, product
        try:
            if (syms == NULL or next_node == NULL or prev_node == NULL or merged_nodes == NULL
                    or heap == NULL or round_entries == NULL):
                raise MemoryError()
            for i in range(n):
                syms[i] = self.byte_symbol[self.word[i]]
                next_node[i] = i + 1 if i + 1 < n else -1
                prev_node[i] = i - 1
            for i in range(n - 1):
                entry.rank = self._rank(syms[i], syms[i + 1], &product)
                if entry.rank != NO_RANK:
                    entry.position = i
                    entry.left = syms[i]
                    entry.right = syms[i + 1]
                    _heap_push(heap, &size, entry)
            while size > 0:
                rank = heap[0].rank
                num_round = 0
                while size > 0 and heap[0].rank == rank:
                    round_entries[num_round] = _heap_pop(heap, &size)
                    num_round += 1
                num_merged = 0
                for i in range(num_round):  # ascending positions: left to right, non-overlapping
                    p = round_entries[i].position
                    q = next_node[p]
                    if syms[p] != round_entries[i].left or q < 0 or syms[q] != round_entries[i].right:
                        continue
                    if prev_node[p] == -2:
                        continue  # p was merged into its left neighbour
                    self._rank(syms[p], syms[q], &product)
                    syms[p] = product
                    next_node[p] = next_node[q]
                    if next_node[q] >= 0:
                        prev_node[next_node[q]] = p
                    prev_node[q] = -2  # dead
                    merged_nodes[num_merged] = p
                    num_merged += 1
                for i in range(num_merged):
                    p = merged_nodes[i]
                    if prev_node[p] == -2:
                        continue
                    q = prev_node[p]
                    if q >= 0:
                        entry.rank = self._rank(syms[q], syms[p], &product)
                        if entry.rank != NO_RANK:
                            entry.position = q
                            entry.left = syms[q]
                            entry.right = syms[p]
                            _heap_push(heap, &size, entry)
                    q = next_node[p]
                    if q >= 0:
                        entry.rank = self._rank(syms[p], syms[q], &product)
                        if entry.rank != NO_RANK:
                            entry.position = p
                            entry.left = syms[p]
                            entry.right = syms[q]
                            _heap_push(heap, &size, entry)
            self._reserve_out(n)
            num_merged = 0  # reused as the output count
            p = 0  # node 0 never dies: merges keep the left node
            while p >= 0:
                self.out[self.out_len + num_merged] = self.symbol_id[syms[p]]
                num_merged += 1
                p = next_node[p]
            self.out_len += num_merged
            return num_merged
        finally:
            free(syms)
            free(next_node)
            free(prev_node)
            free(merged_nodes)
            free(heap)
            free(round_entries)

    cdef Py_ssize_t _bpe(self, Py_ssize_t num_bytes) except -1:
        """Merges self.word[:num_bytes]; appends the ids to out and returns how many."""
        if num_bytes >= HEAP_MERGE_MIN_BYTES:
            return self._bpe_heap(num_bytes)
        cdef uint32_t* syms = self.syms
        cdef uint32_t* ranks = self.ranks
        cdef uint32_t* results = self.results
        cdef Py_ssize_t* source = self.source
        cdef uint8_t* merged = self.merged
        cdef Py_ssize_t m = num_bytes, i, j, first, k
        cdef uint32_t best, left, right, product
        for i in range(m):
            syms[i] = self.byte_symbol[self.word[i]]
        for i in range(m - 1):
            ranks[i] = self._rank(syms[i], syms[i + 1], &results[i])
        while m > 1:
            best = NO_RANK
            first = -1
            for i in range(m - 1):
                if ranks[i] < best:
                    best = ranks[i]
                    first = i
            if first < 0:
                break
            left = syms[first]
            right = syms[first + 1]
            product = results[first]
            # The first occurrence is at `first`, so the symbols before it stay where they are.
            i = first
            j = first
            while i < m:
                if i + 1 < m and syms[i] == left and syms[i + 1] == right:
                    syms[j] = product
                    merged[j] = 1
                    i += 2
                else:
                    syms[j] = syms[i]
                    merged[j] = 0
                    source[j] = i
                    i += 1
                j += 1
            m = j
            if first > 0:
                ranks[first - 1] = self._rank(syms[first - 1], syms[first], &results[first - 1])
            # Pairs of two untouched symbols keep their rank; source[k] >= k so reading in place is safe.
            for k in range(first, m - 1):
                if merged[k] or merged[k + 1]:
                    ranks[k] = self._rank(syms[k], syms[k + 1], &results[k])
                else:
                    ranks[k] = ranks[source[k]]
                    results[k] = results[source[k]]
        self._reserve_out(m)
        for i in range(m):
            self.out[self.out_len + i] = self.symbol_id[syms[i]]
        self.out_len += m
        return m

    cdef int _encode_word(self, Py_ssize_t num_bytes, uint64_t hash) except -1:
        cdef uint64_t slot
        cdef CacheEntry* entry
        cdef Py_ssize_t count
        if num_bytes == 1:
            self._reserve_out(1)
            self.out[self.out_len] = self.symbol_id[self.byte_symbol[self.word[0]]]
            self.out_len += 1
            return 0
        if num_bytes > MAX_CACHED_WORD_BYTES:
            self._bpe(num_bytes)
            return 0
        slot = hash & self.cache_mask
        while True:
            entry = &self.entries[slot]
            if entry.ids_len == 0:
                break
            if (entry.hash == hash and entry.key_len == num_bytes
                    and memcmp(self.key_arena + entry.key_offset, self.word, num_bytes) == 0):
                self._reserve_out(entry.ids_len)
                memcpy(self.out + self.out_len, self.ids_arena + entry.ids_offset,
                       entry.ids_len * sizeof(uint32_t))
                self.out_len += entry.ids_len
                return 0
            slot = (slot + 1) & self.cache_mask
        count = self._bpe(num_bytes)
        # Bounded memory whatever the corpus: a full cache is simply emptied and refilled.
        if (self.cache_count >= self.cache_limit or self.key_used + num_bytes > self.key_capacity
                or self.ids_used + count > self.ids_capacity):
            self._clear_cache()
            slot = hash & self.cache_mask
            entry = &self.entries[slot]
        memcpy(self.key_arena + self.key_used, self.word, num_bytes)
        memcpy(self.ids_arena + self.ids_used, self.out + self.out_len - count, count * sizeof(uint32_t))
        entry.hash = hash
        entry.key_offset = self.key_used
        entry.key_len = num_bytes
        entry.ids_offset = self.ids_used
        entry.ids_len = count
        self.key_used += num_bytes
        self.ids_used += count
        self.cache_count += 1
        return 0

    # ---------------------------------------------------------------- scan

    cdef int _emit(self, const char_t* text, Py_ssize_t start, Py_ssize_t end) except -1:
        """UTF-8 encodes one pretoken into self.word (hashing as it goes) and encodes it."""
        cdef Py_ssize_t i, n = 0
        cdef uint32_t c
        cdef uint64_t hash = FNV_OFFSET
        cdef uint8_t* word
        if self.spans is not None:
            self.spans.append((start, end))
            return 0
        self._reserve_word(4 * (end - start))
        word = self.word
        for i in range(start, end):
            c = text[i]
            if c < 0x80:
                word[n] = c
                n += 1
            elif c < 0x800:
                word[n] = 0xC0 | (c >> 6)
                word[n + 1] = 0x80 | (c & 0x3F)
                n += 2
            elif c < 0x10000:
                if char_t is not uint8_t:
                    if 0xD800 <= c < 0xE000:
                        # A lone surrogate (e.g. a JSON "\ud800" escape) has no UTF-8 form.
                        self.bad_char = True
                word[n] = 0xE0 | (c >> 12)
                word[n + 1] = 0x80 | ((c >> 6) & 0x3F)
                word[n + 2] = 0x80 | (c & 0x3F)
                n += 3
            else:
                word[n] = 0xF0 | (c >> 18)
                word[n + 1] = 0x80 | ((c >> 12) & 0x3F)
                word[n + 2] = 0x80 | ((c >> 6) & 0x3F)
                word[n + 3] = 0x80 | (c & 0x3F)
                n += 4
        for i in range(n):
            hash = (hash ^ word[i]) * FNV_PRIME
        return self._encode_word(n, hash)

    cdef int _scan(self, const char_t* text, Py_ssize_t n) except -1:
        cdef const uint8_t* classes = self.classes
        cdef Py_ssize_t i = 0, start, j
        cdef uint32_t c, d, e
        cdef uint8_t cls
        while i < n:
            start = i
            c = text[i]
            # 's|'t|'re|'ve|'m|'ll|'d come first in the pattern, so they win over the "other" run.
            if c == 39 and i + 1 < n:
                d = text[i + 1]
                if d == 115 or d == 116 or d == 109 or d == 100:
                    self._emit(text, i, i + 2)
                    i += 2
                    continue
                if i + 2 < n:
                    e = text[i + 2]
                    if (e == 101 and (d == 114 or d == 118)) or (d == 108 and e == 108):
                        self._emit(text, i, i + 3)
                        i += 3
                        continue
            cls = classes[c]
            if cls == CLS_SPACE:
                if c == 32 and i + 1 < n and classes[text[i + 1]] != CLS_SPACE:
                    # ` ?\p{L}+`, ` ?\p{N}+`, ` ?[^\s\p{L}\p{N}]+`: one space joins the next run.
                    i += 1
                    cls = classes[text[i]]
                else:
                    j = i + 1
                    while j < n and classes[text[j]] == CLS_SPACE:
                        j += 1
                    # `\s+(?!\S)` backtracks one char before a non-space; a single char falls to `\s+`.
                    if j < n and j - i >= 2:
                        j -= 1
                    self._emit(text, start, j)
                    i = j
                    continue
            j = i + 1
            while j < n and classes[text[j]] == cls:
                j += 1
            self._emit(text, start, j)
            i = j
        return 0

    cdef int _scan_text(self, str text) except -1:
        cdef Py_ssize_t n = PyUnicode_GET_LENGTH(text)
        cdef unsigned int kind = PyUnicode_KIND(text)
        cdef void* data = PyUnicode_DATA(text)
        if kind == 1:
            return self._scan(<const uint8_t*> data, n)
        if kind == 2:
            return self._scan(<const uint16_t*> data, n)
        return self._scan(<const uint32_t*> data, n)

    # ---------------------------------------------------------------- Python API

    def encode_batch(self, list texts, *, bint append_eod=False, int64_t eod=0):
        """Encodes each text; returns (ids uint32 back to back, lengths int64). A text holding a lone
        surrogate gets length -1 and no ids. A text with no tokens gets length 0 and no EOD."""
        cdef Py_ssize_t index, begin, num_texts = len(texts)
        cdef int64_t[::1] lengths_view
        cdef uint32_t[::1] ids_view
        cdef object text
        lengths = np.empty(num_texts, dtype=np.int64)
        lengths_view = lengths
        self.out_len = 0
        for index in range(num_texts):
            text = texts[index]
            if type(text) is not str:
                raise TypeError(f"text {index} is {type(text).__name__}, not str")
            begin = self.out_len
            self.bad_char = False
            self._scan_text(text)
            if self.bad_char:
                self.out_len = begin
                lengths_view[index] = -1
                continue
            if append_eod and self.out_len > begin:
                self._reserve_out(1)
                self.out[self.out_len] = <uint32_t> eod
                self.out_len += 1
            lengths_view[index] = self.out_len - begin
        ids = np.empty(self.out_len, dtype=np.uint32)
        if self.out_len:
            ids_view = ids
            memcpy(&ids_view[0], self.out, self.out_len * sizeof(uint32_t))
        if self.out_capacity > (1 << 24):
            # One huge batch should not pin its buffer for the rest of the run.
            self.out_capacity = 1 << 16
            self.out = <uint32_t*> _grow(self.out, self.out_capacity * sizeof(uint32_t))
        self.out_len = 0
        return ids, lengths

    def split(self, str text):
        """The pretokens of `text`, as regex.findall(GPT2_SPLIT_PATTERN, text) returns them."""
        self.spans = []
        try:
            self._scan_text(text)
            return [text[start:end] for start, end in self.spans]
        finally:
            self.spans = None

    def clear_cache(self):
        self._clear_cache()

    @property
    def num_cached_words(self):
        return self.cache_count


cdef void* _grow(void* pointer, size_t num_bytes) except NULL:
    cdef void* grown = realloc(pointer, num_bytes)
    if grown == NULL:
        raise MemoryError()
    return grown
