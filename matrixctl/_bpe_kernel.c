/* The byte-level BPE tokenizer's compiled kernel (docs/tokenizers.md, "Speed";
 * matrixctl/tokenizers/model/bpe.py, `ByteLevelBPE`).
 *
 * classes(ranges, white) -> bytes
 *     One byte per code point (0x110000 of them): the pre-tokenizers' character classes as bit
 *     flags, CLASS_L (letter), CLASS_N (number), CLASS_W (white space), CLASS_M (mark). L is
 *     what the running interpreter calls alphabetic (`str.isalpha`: general category L*), N what
 *     it calls numeric and not alphabetic (category N*; a test checks both against
 *     `unicodedata.category` for every code point), W the code points of `white`; each
 *     (first, last, flags) of `ranges` then adds its flags (the code points Unicode 15.0 and 15.1
 *     assigned, llama.cpp's tables being 15.1; the marks, for the one pre-tokenizer using them).
 *
 * Model(kind, classes, byte_sym, sym_token, missing_off, missing_ids, merges, vocab_blob,
 *       vocab_off, vocab_ids, ignore_merges, cache_limit)
 *     kind: which pre-tokenizer expression (KIND_GPT2, KIND_LLAMA3, KIND_QWEN2, KIND_QWEN35;
 *     bpe.py's `_llama_patterns` holds the expressions these scanners follow, character for
 *     character; KIND_STARCODER is llama.cpp's two steps for starcoder, refact and command-r:
 *     every number code point alone, GPT-2's expression on the text between them). The integer tables (native int32 buffers) describe the BPE:
 *     - symbols are byte strings, numbered: byte_sym[b] is the symbol of the single byte b;
 *     - sym_token[s] is the token id of symbol s, or -1 when no token spells it: such a symbol
 *       gives missing_ids[missing_off[s]:missing_off[s + 1]] instead (bpe.py's `_missing`);
 *     - merges holds (left, right, rank, merged) quadruples: the pair of adjacent symbols
 *       (left, right) merges into `merged`, lowest rank first, the leftmost of equal ranks
 *       first (one rank per pair);
 *     - vocab_*: every token's bytes and id, for `ignore_merges` (a chunk that is a token is
 *       that token).
 *
 * Model.encode(text) -> bytes (native int32 ids)
 *     The whole text in one call, with the GIL released: the pre-tokenizer's scanner cuts it into
 *     chunks, each chunk's UTF-8 bytes (a lone surrogate as its three "surrogatepass" bytes) are
 *     looked up in the chunk cache (a hash table of chunk bytes -> ids, cleared when it holds
 *     `cache_limit` chunks), and a miss is merged. A lock keeps the cache to one thread at a time.
 * Model.encode_list(text) -> list[int]: the same ids as a list (each id's int object is made
 *     once and shared, so a list costs a pointer per id).
 * Model.bounds(text) -> bytes (native int64): the end of each chunk, in code points (for tests).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NCODE 0x110000
#define CLASS_L 1
#define CLASS_N 2
#define CLASS_W 4
#define CLASS_M 8

enum { KIND_GPT2 = 1, KIND_LLAMA3 = 2, KIND_QWEN2 = 3, KIND_QWEN35 = 4, KIND_STARCODER = 5 };

#define MAX_CACHED_KEY 256 /* longer chunks are merged every time (they rarely repeat) */
#define SCAN_MAX 256       /* chunks up to this many bytes merge by a scan, longer by a heap */

/* ---- classes -------------------------------------------------------------------------------- */

static PyObject *classes(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *ranges, *white;
    if (!PyArg_ParseTuple(args, "OU", &ranges, &white)) return NULL;
    PyObject *seq = PySequence_Fast(ranges, "ranges must be a sequence of (first, last, flags)");
    if (!seq) return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, NCODE);
    if (!out) {
        Py_DECREF(seq);
        return NULL;
    }
    uint8_t *t = (uint8_t *)PyBytes_AS_STRING(out);
    for (Py_UCS4 cp = 0; cp < NCODE; cp++) {
        uint8_t f = 0;
        if (Py_UNICODE_ISALPHA(cp)) f = CLASS_L;
        else if (Py_UNICODE_ISNUMERIC(cp)) f = CLASS_N;
        t[cp] = f;
    }
    Py_ssize_t nw = PyUnicode_GET_LENGTH(white);
    for (Py_ssize_t i = 0; i < nw; i++) t[PyUnicode_READ_CHAR(white, i)] |= CLASS_W;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    for (Py_ssize_t i = 0; i < n; i++) {
        long first, last, flags;
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        if (!PyTuple_Check(item)) {
            PyErr_SetString(PyExc_TypeError, "each range must be a tuple (first, last, flags)");
            goto fail;
        }
        if (!PyArg_ParseTuple(item, "lll", &first, &last, &flags)) goto fail;
        if (first < 0 || last >= NCODE || first > last || flags < 0 || flags > 255) {
            PyErr_SetString(PyExc_ValueError, "a range is outside the code points");
            goto fail;
        }
        for (long cp = first; cp <= last; cp++) t[cp] |= (uint8_t)flags;
    }
    Py_DECREF(seq);
    return out;
fail:
    Py_DECREF(seq);
    Py_DECREF(out);
    return NULL;
}

/* ---- hashing -------------------------------------------------------------------------------- */

static inline uint64_t mix(uint64_t h) {
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdULL;
    h ^= h >> 33;
    return h;
}

static inline uint64_t hash_bytes(const uint8_t *p, size_t n) {
    uint64_t h = 0x9E3779B97F4A7C15ULL ^ (uint64_t)n;
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        h = (h ^ v) * 0xC2B2AE3D27D4EB4FULL;
        h ^= h >> 29;
        p += 8;
        n -= 8;
    }
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) v |= (uint64_t)p[i] << (8 * i);
    return mix((h ^ v) * 0xC2B2AE3D27D4EB4FULL);
}

/* ---- pair table: (left, right) -> (rank, merged) --------------------------------------------- */

typedef struct {
    int32_t left; /* -1: a free slot */
    int32_t right;
    int32_t rank;
    int32_t merged;
} Pair;

static inline const Pair *pair_find(const Pair *pairs, uint64_t mask, int32_t l, int32_t r) {
    uint64_t at = mix(((uint64_t)(uint32_t)l << 32) | (uint32_t)r) & mask;
    for (;;) {
        const Pair *p = &pairs[at];
        if (p->left == l && p->right == r) return p;
        if (p->left < 0) return NULL;
        at = (at + 1) & mask;
    }
}

/* ---- byte-string tables: the vocabulary (bytes -> id) and the chunk cache (bytes -> ids) ---- */

typedef struct {
    uint64_t hash;
    uint32_t key_off, key_len; /* in keys */
    uint32_t val_off, val_len; /* in vals */
} Entry;

typedef struct {
    uint32_t *slots; /* entry index + 1, 0 = free */
    uint64_t mask;
    Entry *entries;
    uint32_t nentries, cap_entries;
    uint8_t *keys;
    size_t nkeys, cap_keys;
    int32_t *vals;
    size_t nvals, cap_vals;
} BytesMap;

static void map_free(BytesMap *m) {
    PyMem_RawFree(m->slots);
    PyMem_RawFree(m->entries);
    PyMem_RawFree(m->keys);
    PyMem_RawFree(m->vals);
    memset(m, 0, sizeof(*m));
}

/* A map for up to `cap` entries (slots: a power of two at least twice that). 0, or -1. */
static int map_init(BytesMap *m, uint32_t cap) {
    memset(m, 0, sizeof(*m));
    uint64_t nslots = 64;
    while (nslots < (uint64_t)cap * 2) nslots <<= 1;
    m->slots = PyMem_RawCalloc((size_t)nslots, sizeof(uint32_t));
    m->entries = PyMem_RawMalloc(sizeof(Entry) * (size_t)(cap ? cap : 1));
    if (!m->slots || !m->entries) {
        map_free(m);
        return -1;
    }
    m->mask = nslots - 1;
    m->cap_entries = cap;
    return 0;
}

static void map_clear(BytesMap *m) {
    memset(m->slots, 0, sizeof(uint32_t) * (size_t)(m->mask + 1));
    m->nentries = 0;
    m->nkeys = 0;
    m->nvals = 0;
}

static inline const Entry *map_find(const BytesMap *m, const uint8_t *key, size_t len,
                                    uint64_t h) {
    uint64_t at = h & m->mask;
    for (;;) {
        uint32_t s = m->slots[at];
        if (s == 0) return NULL;
        const Entry *e = &m->entries[s - 1];
        if (e->hash == h && e->key_len == len && memcmp(m->keys + e->key_off, key, len) == 0)
            return e;
        at = (at + 1) & m->mask;
    }
}

static int grow(void **buf, size_t *cap, size_t need, size_t item) {
    if (need <= *cap) return 0;
    size_t more = *cap ? *cap : 1024;
    while (more < need) more *= 2;
    void *g = PyMem_RawRealloc(*buf, more * item);
    if (!g) return -1;
    *buf = g;
    *cap = more;
    return 0;
}

/* Add key -> vals (the key must not be there, and there must be room). 0, or -1: no memory. */
static int map_add(BytesMap *m, const uint8_t *key, size_t len, uint64_t h, const int32_t *vals,
                   size_t nvals) {
    if (m->nentries >= m->cap_entries) return 0;
    if (grow((void **)&m->keys, &m->cap_keys, m->nkeys + len, 1) < 0) return -1;
    if (grow((void **)&m->vals, &m->cap_vals, m->nvals + nvals, sizeof(int32_t)) < 0) return -1;
    Entry *e = &m->entries[m->nentries];
    e->hash = h;
    e->key_off = (uint32_t)m->nkeys;
    e->key_len = (uint32_t)len;
    e->val_off = (uint32_t)m->nvals;
    e->val_len = (uint32_t)nvals;
    memcpy(m->keys + m->nkeys, key, len);
    memcpy(m->vals + m->nvals, vals, nvals * sizeof(int32_t));
    m->nkeys += len;
    m->nvals += nvals;
    uint64_t at = h & m->mask;
    while (m->slots[at] != 0) at = (at + 1) & m->mask;
    m->slots[at] = ++m->nentries;
    return 0;
}

/* ---- the model ---------------------------------------------------------------------------- */

typedef struct {
    PyObject_HEAD
    int kind;
    int ignore_merges;
    PyObject *classes_obj;
    const uint8_t *cls;
    int32_t byte_sym[256];
    int32_t nsym;
    int32_t *sym_token;
    int32_t *missing_off;
    int32_t *missing_ids;
    Pair *pairs;
    uint64_t pair_mask;
    BytesMap vocab;
    int has_vocab;
    BytesMap cache;
    uint32_t cache_limit;
    PyThread_type_lock lock;
    PyObject **ints; /* the int object of each id, made on first use (encode_list) */
    int32_t nints;
    /* scratch, used under the lock */
    uint8_t *key;
    size_t cap_key;
    int32_t *syms, *prank, *pmerged, *nxt, *prv, *tmp;
    size_t cap_syms;
    int64_t *heap;
    size_t cap_heap;
} ModelObject;

static void Model_dealloc(ModelObject *self) {
    Py_XDECREF(self->classes_obj);
    if (self->ints) {
        for (int32_t i = 0; i < self->nints; i++) Py_XDECREF(self->ints[i]);
        PyMem_Free(self->ints);
    }
    PyMem_RawFree(self->sym_token);
    PyMem_RawFree(self->missing_off);
    PyMem_RawFree(self->missing_ids);
    PyMem_RawFree(self->pairs);
    map_free(&self->vocab);
    map_free(&self->cache);
    if (self->lock) PyThread_free_lock(self->lock);
    PyMem_RawFree(self->key);
    PyMem_RawFree(self->syms);
    PyMem_RawFree(self->prank);
    PyMem_RawFree(self->pmerged);
    PyMem_RawFree(self->nxt);
    PyMem_RawFree(self->prv);
    PyMem_RawFree(self->tmp);
    PyMem_RawFree(self->heap);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* A copy of an int32 buffer argument, its item count in *n. */
static int32_t *int32_copy(PyObject *obj, const char *what, Py_ssize_t *n) {
    Py_buffer b;
    if (PyObject_GetBuffer(obj, &b, PyBUF_SIMPLE) < 0) return NULL;
    if (b.len % 4 != 0) {
        PyBuffer_Release(&b);
        PyErr_Format(PyExc_ValueError, "%s is not a buffer of int32", what);
        return NULL;
    }
    int32_t *out = PyMem_RawMalloc(b.len ? (size_t)b.len : 4);
    if (!out) {
        PyBuffer_Release(&b);
        PyErr_NoMemory();
        return NULL;
    }
    memcpy(out, b.buf, (size_t)b.len);
    *n = b.len / 4;
    PyBuffer_Release(&b);
    return out;
}

static int Model_init(ModelObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"kind",       "classes",   "byte_sym",  "sym_token",
                             "missing_off", "missing_ids", "merges",  "vocab_blob",
                             "vocab_off",  "vocab_ids", "ignore_merges", "cache_limit",
                             NULL};
    int kind, ignore_merges;
    unsigned int cache_limit;
    PyObject *cls, *byte_sym, *sym_token, *missing_off, *missing_ids, *merges, *blob, *voff,
        *vids;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iSOOOOOOOOpI", kwlist, &kind, &cls, &byte_sym,
                                     &sym_token, &missing_off, &missing_ids, &merges, &blob,
                                     &voff, &vids, &ignore_merges, &cache_limit))
        return -1;
    if (self->lock) {
        PyErr_SetString(PyExc_TypeError, "Model is already initialized");
        return -1;
    }
    if (kind < KIND_GPT2 || kind > KIND_STARCODER) {
        PyErr_Format(PyExc_ValueError, "unknown kind %d", kind);
        return -1;
    }
    if (PyBytes_GET_SIZE(cls) != NCODE) {
        PyErr_SetString(PyExc_ValueError, "classes must hold one byte per code point");
        return -1;
    }
    if (cache_limit > (1u << 22)) {
        PyErr_SetString(PyExc_ValueError, "cache_limit is too large");
        return -1;
    }
    Py_ssize_t n, nsym, noff, nmiss, nmerge, nvoff, nvids;
    int32_t *bs = int32_copy(byte_sym, "byte_sym", &n);
    if (!bs) return -1;
    if (n != 256) {
        PyMem_RawFree(bs);
        PyErr_SetString(PyExc_ValueError, "byte_sym must hold 256 symbols");
        return -1;
    }
    memcpy(self->byte_sym, bs, sizeof(self->byte_sym));
    PyMem_RawFree(bs);
    int32_t *quads = NULL, *offs = NULL, *ids = NULL;
    Py_buffer vb = {0};
    int have_vb = 0;
    if (!(self->sym_token = int32_copy(sym_token, "sym_token", &nsym))) goto fail;
    if (!(self->missing_off = int32_copy(missing_off, "missing_off", &noff))) goto fail;
    if (!(self->missing_ids = int32_copy(missing_ids, "missing_ids", &nmiss))) goto fail;
    if (!(quads = int32_copy(merges, "merges", &nmerge))) goto fail;
    if (nsym <= 0 || nsym > INT32_MAX - 1 || noff != nsym + 1 || nmerge % 4 != 0) {
        PyErr_SetString(PyExc_ValueError, "inconsistent symbol tables");
        goto fail;
    }
    self->nsym = (int32_t)nsym;
    for (int b = 0; b < 256; b++)
        if (self->byte_sym[b] < 0 || self->byte_sym[b] >= nsym) {
            PyErr_SetString(PyExc_ValueError, "a byte symbol is outside the symbols");
            goto fail;
        }
    if (self->missing_off[0] != 0 || self->missing_off[nsym] != nmiss) {
        PyErr_SetString(PyExc_ValueError, "missing_off does not cover missing_ids");
        goto fail;
    }
    for (Py_ssize_t s = 0; s < nsym; s++)
        if (self->missing_off[s] > self->missing_off[s + 1]) {
            PyErr_SetString(PyExc_ValueError, "missing_off is not ascending");
            goto fail;
        }
    nmerge /= 4;
    uint64_t nslots = 64;
    while (nslots < (uint64_t)nmerge * 2) nslots <<= 1;
    self->pairs = PyMem_RawMalloc(sizeof(Pair) * (size_t)nslots);
    if (!self->pairs) {
        PyErr_NoMemory();
        goto fail;
    }
    memset(self->pairs, 0xFF, sizeof(Pair) * (size_t)nslots);
    self->pair_mask = nslots - 1;
    for (Py_ssize_t i = 0; i < nmerge; i++) {
        int32_t l = quads[4 * i], r = quads[4 * i + 1], rank = quads[4 * i + 2],
                m = quads[4 * i + 3];
        if (l < 0 || l >= nsym || r < 0 || r >= nsym || m < 0 || m >= nsym || rank < 0) {
            PyErr_Format(PyExc_ValueError, "merge %zd is outside the symbols", i);
            goto fail;
        }
        uint64_t at = mix(((uint64_t)(uint32_t)l << 32) | (uint32_t)r) & self->pair_mask;
        while (self->pairs[at].left >= 0) {
            if (self->pairs[at].left == l && self->pairs[at].right == r) {
                PyErr_Format(PyExc_ValueError, "merge %zd is listed twice", i);
                goto fail;
            }
            at = (at + 1) & self->pair_mask;
        }
        self->pairs[at] = (Pair){l, r, rank, m};
    }
    PyMem_RawFree(quads);
    quads = NULL;
    if (ignore_merges) {
        if (PyObject_GetBuffer(blob, &vb, PyBUF_SIMPLE) < 0) goto fail;
        have_vb = 1;
        if (!(offs = int32_copy(voff, "vocab_off", &nvoff))) goto fail;
        if (!(ids = int32_copy(vids, "vocab_ids", &nvids))) goto fail;
        if (nvoff != nvids + 1 || nvids >= (1 << 30) || offs[0] != 0 || offs[nvids] != vb.len) {
            PyErr_SetString(PyExc_ValueError, "inconsistent vocabulary tables");
            goto fail;
        }
        if (map_init(&self->vocab, (uint32_t)(nvids ? nvids : 1)) < 0) {
            PyErr_NoMemory();
            goto fail;
        }
        self->has_vocab = 1;
        const uint8_t *base = vb.buf;
        for (Py_ssize_t i = 0; i < nvids; i++) {
            if (offs[i] > offs[i + 1]) {
                PyErr_SetString(PyExc_ValueError, "vocab_off is not ascending");
                goto fail;
            }
            const uint8_t *k = base + offs[i];
            size_t len = (size_t)(offs[i + 1] - offs[i]);
            uint64_t h = hash_bytes(k, len);
            if (map_find(&self->vocab, k, len, h)) continue; /* the first id of a repeat */
            if (map_add(&self->vocab, k, len, h, &ids[i], 1) < 0) {
                PyErr_NoMemory();
                goto fail;
            }
        }
        PyBuffer_Release(&vb);
        have_vb = 0;
        PyMem_RawFree(offs);
        PyMem_RawFree(ids);
        offs = ids = NULL;
    }
    int32_t top = -1; /* the largest id the tables give */
    for (Py_ssize_t i = 0; i < nsym; i++)
        if (self->sym_token[i] > top) top = self->sym_token[i];
    for (Py_ssize_t i = 0; i < nmiss; i++)
        if (self->missing_ids[i] > top) top = self->missing_ids[i];
    for (Py_ssize_t i = 0; self->has_vocab && i < (Py_ssize_t)self->vocab.nvals; i++)
        if (self->vocab.vals[i] > top) top = self->vocab.vals[i];
    self->nints = top + 1;
    if (map_init(&self->cache, cache_limit) < 0) {
        PyErr_NoMemory();
        goto fail;
    }
    self->cache_limit = cache_limit;
    self->kind = kind;
    self->ignore_merges = ignore_merges;
    Py_INCREF(cls);
    self->classes_obj = cls;
    self->cls = (const uint8_t *)PyBytes_AS_STRING(cls);
    self->lock = PyThread_allocate_lock();
    if (!self->lock) {
        PyErr_NoMemory();
        goto fail;
    }
    return 0;
fail:
    if (have_vb) PyBuffer_Release(&vb);
    PyMem_RawFree(quads);
    PyMem_RawFree(offs);
    PyMem_RawFree(ids);
    return -1;
}

/* ---- pre-tokenizers: the end of the chunk starting at i (i < n) ------------------------------
 * Each follows its expression in bpe.py (`_llama_patterns`): the alternatives in order, each
 * greedy, as Python's `re` matches them. Every code point is exactly one of L, N, W or other
 * (M is an "other" except for qwen35), so some alternative always matches. */

#define IS_NL(c) ((c) == '\r' || (c) == '\n')
#define LOWER(c) ((c) >= 'A' && (c) <= 'Z' ? (c) + 32 : (c))

/* `[W]+(?![^W])|[W]+` from i (a white space); for llama3's kinds first `[W]*[\r\n]+`. */
#define WHITE_TAIL(T, NEWLINES)                                             \
    do {                                                                    \
        Py_ssize_t k = i + 1;                                               \
        while (k < n && (cls[s[k]] & CLASS_W)) k++;                         \
        if (NEWLINES) {                                                     \
            for (Py_ssize_t p = k - 1; p >= i; p--)                         \
                if (IS_NL(s[p])) return p + 1;                              \
        }                                                                   \
        if (k == n) return n;                                               \
        return k - i >= 2 ? k - 1 : k;                                      \
    } while (0)

#define DEFINE_SCANNERS(SUFFIX, T)                                                               \
    /* 's|'t|'re|'ve|'m|'ll|'d| ?[L]+| ?[N]+| ?[^WLN]+|[W]+(?![^W])|[W]+ */                      \
    static inline Py_ssize_t gpt2_##SUFFIX(const T *s, Py_ssize_t i, Py_ssize_t n,              \
                                           const uint8_t *cls) {                                \
        Py_UCS4 c = s[i];                                                                        \
        if (c == '\'' && i + 1 < n) {                                                            \
            Py_UCS4 c1 = s[i + 1];                                                               \
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;                  \
            if (i + 2 < n) {                                                                     \
                Py_UCS4 c2 = s[i + 2];                                                           \
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||                      \
                    (c1 == 'l' && c2 == 'l'))                                                    \
                    return i + 3;                                                                \
            }                                                                                    \
        }                                                                                        \
        Py_ssize_t j = (c == ' ' && i + 1 < n) ? i + 1 : i;                                      \
        uint8_t f = cls[s[j]] & (CLASS_L | CLASS_N | CLASS_W);                                   \
        if (f == CLASS_L || f == CLASS_N || f == 0) {                                            \
            j++;                                                                                 \
            while (j < n && (cls[s[j]] & (CLASS_L | CLASS_N | CLASS_W)) == f) j++;               \
            return j;                                                                            \
        }                                                                                        \
        WHITE_TAIL(T, 0);                                                                        \
    }                                                                                            \
    /* (?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\nLN]?[L]+|[N]{1,3}        \
       | ?[^WLN]+[\r\n]*|[W]*[\r\n]+|[W]+(?![^W])|[W]+ (qwen2: [N]; qwen35: L is [LM], and      \
       the "other" class excludes M too) */                                                      \
    static inline Py_ssize_t llama3_##SUFFIX(const T *s, Py_ssize_t i, Py_ssize_t n,            \
                                             const uint8_t *cls, int kind) {                    \
        Py_UCS4 c = s[i];                                                                        \
        if (c == '\'' && i + 1 < n) {                                                            \
            Py_UCS4 c1 = LOWER(s[i + 1]);                                                        \
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return i + 2;                  \
            if (i + 2 < n) {                                                                     \
                Py_UCS4 c2 = LOWER(s[i + 2]);                                                    \
                if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') ||                      \
                    (c1 == 'l' && c2 == 'l'))                                                    \
                    return i + 3;                                                                \
            }                                                                                    \
        }                                                                                        \
        const uint8_t letter = kind == KIND_QWEN35 ? (CLASS_L | CLASS_M) : CLASS_L;              \
        const uint8_t word = letter | CLASS_N | CLASS_W;                                         \
        uint8_t fc = cls[c];                                                                     \
        if (!(fc & (CLASS_L | CLASS_N)) && !IS_NL(c) && i + 1 < n && (cls[s[i + 1]] & letter)) { \
            Py_ssize_t j = i + 2;                                                                \
            while (j < n && (cls[s[j]] & letter)) j++;                                           \
            return j;                                                                            \
        }                                                                                        \
        if (fc & letter) {                                                                       \
            Py_ssize_t j = i + 1;                                                                \
            while (j < n && (cls[s[j]] & letter)) j++;                                           \
            return j;                                                                            \
        }                                                                                        \
        if (fc & CLASS_N) {                                                                      \
            if (kind != KIND_LLAMA3) return i + 1;                                               \
            Py_ssize_t j = i + 1;                                                                \
            while (j < n && j < i + 3 && (cls[s[j]] & CLASS_N)) j++;                             \
            return j;                                                                            \
        }                                                                                        \
        Py_ssize_t j = (c == ' ' && i + 1 < n) ? i + 1 : i;                                      \
        if (!(cls[s[j]] & word)) {                                                               \
            j++;                                                                                 \
            while (j < n && !(cls[s[j]] & word)) j++;                                            \
            while (j < n && IS_NL(s[j])) j++;                                                    \
            return j;                                                                            \
        }                                                                                        \
        WHITE_TAIL(T, 1);                                                                        \
    }

DEFINE_SCANNERS(1, Py_UCS1)
DEFINE_SCANNERS(4, Py_UCS4)

/* ---- BPE ---------------------------------------------------------------------------------- */

typedef struct {
    int32_t *ids;
    size_t n, cap;
} Out;

static inline int out_put(Out *o, const int32_t *ids, size_t n) {
    if (o->n + n > o->cap && grow((void **)&o->ids, &o->cap, o->n + n, sizeof(int32_t)) < 0)
        return -1;
    memcpy(o->ids + o->n, ids, n * sizeof(int32_t));
    o->n += n;
    return 0;
}

static int scratch(ModelObject *m, size_t n) {
    if (n <= m->cap_syms) return 0;
    size_t cap = m->cap_syms ? m->cap_syms : 256;
    while (cap < n) cap *= 2;
    int32_t **arrays[] = {&m->syms, &m->prank, &m->pmerged, &m->nxt, &m->prv, &m->tmp};
    for (size_t a = 0; a < sizeof(arrays) / sizeof(arrays[0]); a++) {
        int32_t *g = PyMem_RawRealloc(*arrays[a], cap * sizeof(int32_t));
        if (!g) return -1;
        *arrays[a] = g;
    }
    m->cap_syms = cap;
    return 0;
}

/* The final symbols' ids into o. */
static int emit_symbols(ModelObject *m, const int32_t *syms, size_t n, Out *o) {
    for (size_t i = 0; i < n; i++) {
        int32_t s = syms[i];
        int32_t t = m->sym_token[s];
        if (t >= 0) {
            if (out_put(o, &t, 1) < 0) return -1;
        } else {
            int32_t a = m->missing_off[s], b = m->missing_off[s + 1];
            if (b > a && out_put(o, m->missing_ids + a, (size_t)(b - a)) < 0) return -1;
        }
    }
    return 0;
}

#define NO_RANK INT32_MAX

/* Short chunks: the pairwise scan of bpe.py's `merge_symbols` (each pair's rank kept, only the
 * two pairs next to a merge looked up again). */
static size_t merge_scan(ModelObject *m, int32_t *syms, size_t n) {
    int32_t *prank = m->prank, *pmerged = m->pmerged;
    for (size_t i = 0; i + 1 < n; i++) {
        const Pair *p = pair_find(m->pairs, m->pair_mask, syms[i], syms[i + 1]);
        prank[i] = p ? p->rank : NO_RANK;
        pmerged[i] = p ? p->merged : -1;
    }
    while (n > 1) {
        size_t best = 0;
        int32_t best_rank = NO_RANK;
        for (size_t i = 0; i + 1 < n; i++)
            if (prank[i] < best_rank) {
                best_rank = prank[i];
                best = i;
            }
        if (best_rank == NO_RANK) break;
        syms[best] = pmerged[best];
        size_t tail = n - best - 2; /* symbols after the merged pair */
        memmove(syms + best + 1, syms + best + 2, tail * sizeof(int32_t));
        if (tail > 1) { /* the pairs after the (new) pair at best + 1 move down by one */
            memmove(prank + best + 1, prank + best + 2, (tail - 1) * sizeof(int32_t));
            memmove(pmerged + best + 1, pmerged + best + 2, (tail - 1) * sizeof(int32_t));
        }
        n--;
        if (best + 1 < n) {
            const Pair *p = pair_find(m->pairs, m->pair_mask, syms[best], syms[best + 1]);
            prank[best] = p ? p->rank : NO_RANK;
            pmerged[best] = p ? p->merged : -1;
        }
        if (best > 0) {
            const Pair *p = pair_find(m->pairs, m->pair_mask, syms[best - 1], syms[best]);
            prank[best - 1] = p ? p->rank : NO_RANK;
            pmerged[best - 1] = p ? p->merged : -1;
        }
    }
    return n;
}

/* Long chunks: bpe.py's heap of (rank, left, right) over a linked list, stale entries skipped.
 * A heap item packs rank << 32 | left (right is then nxt[left] when the item is current). */
static inline void heap_push(int64_t *h, size_t *len, int64_t v) {
    size_t i = (*len)++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static inline int64_t heap_pop(int64_t *h, size_t *len) {
    int64_t top = h[0], v = h[--(*len)];
    size_t i = 0, n = *len;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= n) break;
        if (c + 1 < n && h[c + 1] < h[c]) c++;
        if (h[c] >= v) break;
        h[i] = h[c];
        i = c;
    }
    if (n) h[i] = v;
    return top;
}

static int merge_heap(ModelObject *m, int32_t *syms, size_t n, size_t *out_n) {
    int32_t *nxt = m->nxt, *prv = m->prv;
    /* at most n - 1 initial items and two per merge */
    size_t need = 3 * n + 1;
    if (need > m->cap_heap) {
        int64_t *g = PyMem_RawRealloc(m->heap, need * sizeof(int64_t));
        if (!g) return -1;
        m->heap = g;
        m->cap_heap = need;
    }
    int64_t *h = m->heap;
    size_t len = 0;
    for (size_t i = 0; i < n; i++) {
        nxt[i] = i + 1 < n ? (int32_t)(i + 1) : -1;
        prv[i] = (int32_t)i - 1;
    }
    for (size_t i = 0; i + 1 < n; i++) {
        const Pair *p = pair_find(m->pairs, m->pair_mask, syms[i], syms[i + 1]);
        if (p) heap_push(h, &len, ((int64_t)p->rank << 32) | (int64_t)i);
    }
    while (len) {
        int64_t item = heap_pop(h, &len);
        int32_t rank = (int32_t)(item >> 32), left = (int32_t)(item & 0xFFFFFFFF);
        if (syms[left] < 0) continue;
        int32_t right = nxt[left];
        if (right < 0) continue;
        const Pair *p = pair_find(m->pairs, m->pair_mask, syms[left], syms[right]);
        if (!p || p->rank != rank) continue;
        syms[left] = p->merged;
        syms[right] = -1;
        int32_t after = nxt[right];
        nxt[left] = after;
        if (after >= 0) prv[after] = left;
        int32_t before = prv[left];
        if (before >= 0) {
            const Pair *q = pair_find(m->pairs, m->pair_mask, syms[before], syms[left]);
            if (q) heap_push(h, &len, ((int64_t)q->rank << 32) | (int64_t)before);
        }
        if (after >= 0) {
            const Pair *q = pair_find(m->pairs, m->pair_mask, syms[left], syms[after]);
            if (q) heap_push(h, &len, ((int64_t)q->rank << 32) | (int64_t)left);
        }
    }
    size_t k = 0;
    for (int32_t i = 0; i >= 0; i = nxt[i]) syms[k++] = syms[i];
    *out_n = k;
    return 0;
}

/* The ids of one chunk (its UTF-8 bytes) appended to o. */
static int chunk_ids(ModelObject *m, const uint8_t *b, size_t n, Out *o) {
    if (m->ignore_merges) {
        const Entry *e = map_find(&m->vocab, b, n, hash_bytes(b, n));
        if (e) return out_put(o, m->vocab.vals + e->val_off, 1);
    }
    if (scratch(m, n) < 0) return -1;
    int32_t *syms = m->syms;
    for (size_t i = 0; i < n; i++) syms[i] = m->byte_sym[b[i]];
    size_t k = n;
    if (n > SCAN_MAX) {
        if (merge_heap(m, syms, n, &k) < 0) return -1;
    } else if (n > 1) {
        k = merge_scan(m, syms, n);
    }
    return emit_symbols(m, syms, k, o);
}

/* One chunk: from the cache, else merged (and cached). */
static inline int chunk(ModelObject *m, const uint8_t *b, size_t n, Out *o) {
    if (n > MAX_CACHED_KEY) return chunk_ids(m, b, n, o);
    uint64_t h = hash_bytes(b, n);
    const Entry *e = map_find(&m->cache, b, n, h);
    if (e) return out_put(o, m->cache.vals + e->val_off, e->val_len);
    size_t before = o->n;
    if (chunk_ids(m, b, n, o) < 0) return -1;
    if (m->cache.nentries >= m->cache_limit) map_clear(&m->cache);
    return map_add(&m->cache, b, n, h, o->ids + before, o->n - before);
}

static inline size_t put_utf8(uint8_t *w, Py_UCS4 c) {
    if (c < 0x80) {
        w[0] = (uint8_t)c;
        return 1;
    }
    if (c < 0x800) {
        w[0] = (uint8_t)(0xC0 | c >> 6);
        w[1] = (uint8_t)(0x80 | (c & 0x3F));
        return 2;
    }
    if (c < 0x10000) { /* a lone surrogate too: its "surrogatepass" bytes */
        w[0] = (uint8_t)(0xE0 | c >> 12);
        w[1] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
        w[2] = (uint8_t)(0x80 | (c & 0x3F));
        return 3;
    }
    w[0] = (uint8_t)(0xF0 | c >> 18);
    w[1] = (uint8_t)(0x80 | ((c >> 12) & 0x3F));
    w[2] = (uint8_t)(0x80 | ((c >> 6) & 0x3F));
    w[3] = (uint8_t)(0x80 | (c & 0x3F));
    return 4;
}

#define DEFINE_ENCODE(SUFFIX, T)                                                                 \
    static int encode_##SUFFIX(ModelObject *m, const T *s, Py_ssize_t n, int ascii, Out *o,     \
                               int64_t **bounds, size_t *nbounds) {                             \
        const uint8_t *cls = m->cls;                                                             \
        size_t cap_bounds = 0;                                                                   \
        Py_ssize_t i = 0, limit = 0;                                                             \
        while (i < n) {                                                                          \
            Py_ssize_t e;                                                                        \
            if (m->kind == KIND_GPT2) {                                                          \
                e = gpt2_##SUFFIX(s, i, n, cls);                                                 \
            } else if (m->kind != KIND_STARCODER) {                                              \
                e = llama3_##SUFFIX(s, i, n, cls, m->kind);                                      \
            } else if (cls[s[i]] & CLASS_N) {                                                    \
                e = i + 1; /* a number alone */                                                  \
            } else { /* GPT-2's expression on the text up to the next number */                  \
                if (limit <= i) {                                                                \
                    limit = i + 1;                                                               \
                    while (limit < n && !(cls[s[limit]] & CLASS_N)) limit++;                     \
                }                                                                                \
                e = gpt2_##SUFFIX(s, i, limit, cls);                                             \
            }                                                                                    \
            if (bounds) {                                                                        \
                if (grow((void **)bounds, &cap_bounds, *nbounds + 1, sizeof(int64_t)) < 0)       \
                    return -1;                                                                   \
                (*bounds)[(*nbounds)++] = e;                                                     \
            } else if (ascii) {                                                                  \
                if (chunk(m, (const uint8_t *)(s + i), (size_t)(e - i), o) < 0) return -1;       \
            } else {                                                                             \
                size_t need = (size_t)(e - i) * 4;                                               \
                if (grow((void **)&m->key, &m->cap_key, need, 1) < 0) return -1;                 \
                size_t len = 0;                                                                  \
                for (Py_ssize_t p = i; p < e; p++) len += put_utf8(m->key + len, s[p]);          \
                if (chunk(m, m->key, len, o) < 0) return -1;                                     \
            }                                                                                    \
            i = e;                                                                               \
        }                                                                                        \
        return 0;                                                                                \
    }

DEFINE_ENCODE(1, Py_UCS1)
DEFINE_ENCODE(4, Py_UCS4)

static int model_ready(ModelObject *m) {
    if (!m->lock) {
        PyErr_SetString(PyExc_ValueError, "Model not initialized");
        return 0;
    }
    return 1;
}

/* A list of the ids (the int objects made once per id and shared). */
static PyObject *id_list(ModelObject *self, const int32_t *ids, size_t n) {
    if (!self->ints && self->nints > 0) {
        self->ints = PyMem_Calloc((size_t)self->nints, sizeof(PyObject *));
        if (!self->ints) return PyErr_NoMemory();
    }
    PyObject *list = PyList_New((Py_ssize_t)n);
    if (!list) return NULL;
    for (size_t i = 0; i < n; i++) {
        int32_t id = ids[i];
        PyObject *v;
        if (id >= 0 && id < self->nints) {
            v = self->ints[id];
            if (!v) {
                v = self->ints[id] = PyLong_FromLong(id);
                if (!v) {
                    Py_DECREF(list);
                    return NULL;
                }
            }
            Py_INCREF(v);
        } else if (!(v = PyLong_FromLong(id))) {
            Py_DECREF(list);
            return NULL;
        }
        PyList_SET_ITEM(list, (Py_ssize_t)i, v);
    }
    return list;
}

enum { RUN_BYTES, RUN_LIST, RUN_BOUNDS };

/* The text's ids (as bytes or a list) or its chunks' ends. */
static PyObject *run(ModelObject *self, PyObject *text, int what) {
    int want_bounds = what == RUN_BOUNDS;
    if (!model_ready(self)) return NULL;
    if (!PyUnicode_Check(text)) {
        PyErr_Format(PyExc_TypeError, "text must be str, not %.100s", Py_TYPE(text)->tp_name);
        return NULL;
    }
    if (PyUnicode_READY(text) < 0) return NULL;
    Py_ssize_t n = PyUnicode_GET_LENGTH(text);
    int kind = PyUnicode_KIND(text);
    Py_UCS4 *wide = NULL;
    if (kind != PyUnicode_1BYTE_KIND) {
        wide = PyUnicode_AsUCS4Copy(text);
        if (!wide) return NULL;
    }
    int ascii = PyUnicode_IS_ASCII(text);
    Out o = {NULL, 0, 0};
    int64_t *bounds = NULL;
    size_t nbounds = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    PyThread_acquire_lock(self->lock, WAIT_LOCK);
    if (wide)
        rc = encode_4(self, wide, n, 0, &o, want_bounds ? &bounds : NULL, &nbounds);
    else
        rc = encode_1(self, (const Py_UCS1 *)PyUnicode_DATA(text), n, ascii, &o,
                      want_bounds ? &bounds : NULL, &nbounds);
    PyThread_release_lock(self->lock);
    Py_END_ALLOW_THREADS
    PyMem_Free(wide);
    PyObject *result = NULL;
    if (rc < 0) PyErr_NoMemory();
    else if (want_bounds)
        result = PyBytes_FromStringAndSize((const char *)bounds,
                                           (Py_ssize_t)(nbounds * sizeof(int64_t)));
    else if (what == RUN_LIST)
        result = id_list(self, o.ids, o.n);
    else
        result = PyBytes_FromStringAndSize((const char *)o.ids, (Py_ssize_t)(o.n * 4));
    PyMem_RawFree(o.ids);
    PyMem_RawFree(bounds);
    return result;
}

static PyObject *Model_encode(ModelObject *self, PyObject *text) {
    return run(self, text, RUN_BYTES);
}

static PyObject *Model_encode_list(ModelObject *self, PyObject *text) {
    return run(self, text, RUN_LIST);
}

static PyObject *Model_bounds(ModelObject *self, PyObject *text) {
    return run(self, text, RUN_BOUNDS);
}

static PyObject *Model_cache_size(ModelObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!model_ready(self)) return NULL;
    return PyLong_FromUnsignedLong(self->cache.nentries);
}

static PyMethodDef Model_methods[] = {
    {"encode", (PyCFunction)Model_encode, METH_O,
     "encode(text) -> bytes: the text's ids as native int32."},
    {"encode_list", (PyCFunction)Model_encode_list, METH_O,
     "encode_list(text) -> list[int]: the text's ids."},
    {"bounds", (PyCFunction)Model_bounds, METH_O,
     "bounds(text) -> bytes: the end of each pre-tokenizer chunk (native int64 code points)."},
    {"cache_size", (PyCFunction)Model_cache_size, METH_NOARGS,
     "cache_size() -> int: the chunks the cache holds."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "matrixctl._bpe_kernel.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Model(kind, classes, ...): a byte-level BPE tokenizer's tables.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Model_init,
    .tp_dealloc = (destructor)Model_dealloc,
    .tp_methods = Model_methods,
};

static PyMethodDef module_methods[] = {
    {"classes", classes, METH_VARARGS,
     "classes(ranges, white) -> bytes: the class flags of every code point."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "matrixctl._bpe_kernel",
    "The byte-level BPE tokenizer's compiled kernel.", -1, module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__bpe_kernel(void) {
    if (PyType_Ready(&ModelType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&ModelType);
    if (PyModule_AddObject(m, "Model", (PyObject *)&ModelType) < 0 ||
        PyModule_AddIntConstant(m, "CLASS_L", CLASS_L) < 0 ||
        PyModule_AddIntConstant(m, "CLASS_N", CLASS_N) < 0 ||
        PyModule_AddIntConstant(m, "CLASS_W", CLASS_W) < 0 ||
        PyModule_AddIntConstant(m, "CLASS_M", CLASS_M) < 0 ||
        PyModule_AddIntConstant(m, "KIND_GPT2", KIND_GPT2) < 0 ||
        PyModule_AddIntConstant(m, "KIND_LLAMA3", KIND_LLAMA3) < 0 ||
        PyModule_AddIntConstant(m, "KIND_QWEN2", KIND_QWEN2) < 0 ||
        PyModule_AddIntConstant(m, "KIND_QWEN35", KIND_QWEN35) < 0 ||
        PyModule_AddIntConstant(m, "KIND_STARCODER", KIND_STARCODER) < 0) {
        Py_DECREF(&ModelType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
