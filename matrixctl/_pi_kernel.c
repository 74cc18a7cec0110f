/* The π tokenizer's compiled kernel: greedy leftmost-longest matching over UTF-8 bytes, and
 * decoding of token ids into bytes (docs/formats/pi-symbol-map.md, "Encoding";
 * docs/benchmarks.md for why this is C).
 *
 * Trie: a byte trie of the patterns (the symbols' keys plus every single byte that is not a
 * symbol, so a match starts at every position), stored as a double array: slot s has `base`,
 * `check` and `value`; the child of s for byte c is t = base[s] + c when check[t] == s. The
 * root is slot 0. A value is the id the pattern ending there gives, -1 (the pattern gives no
 * token) or NO_VALUE (no pattern ends there). Matching at a position walks the trie as far as
 * the bytes allow and takes the deepest slot with a value: the longest pattern starting there.
 * With a pattern for every single byte, this is exactly leftmost-longest matching. One walk
 * step reads one 16-byte slot, and the slots of the bundled map fit in 2-3 MB, so the walk
 * stays in cache (a hash table of edges was 2-3x slower, docs/benchmarks.md).
 *
 * The trie serializes to bytes (`to_bytes`) and loads back (`Trie.from_bytes`) with every
 * index bounds-checked, so a damaged cache is rejected, never followed.
 *
 * Table: the bytes of every id (a decode table), joined for an array of ids.
 *
 * Both release the GIL while they work on buffers, so threads run in parallel.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define NO_VALUE INT64_MIN
#define EMPTY_KEY UINT64_MAX
#define MAGIC "PITRIE02"
#define HEADER_WORDS 4 /* nslots, maxlen, reserved, reserved (uint64 each) */
#define MAX_SLOTS ((uint64_t)INT32_MAX)

typedef struct {
    int32_t base;  /* children of this slot are at base + byte */
    int32_t check; /* the parent slot, -1 for a free slot */
    int64_t value;
} Slot;

typedef struct {
    PyObject_HEAD
    uint64_t nslots;
    uint64_t maxlen;
    Slot *slots;
} TrieObject;

static void Trie_dealloc(TrieObject *self) {
    PyMem_RawFree(self->slots);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- building: a hash trie first (dedup, node numbering), then the double array ---------- */

typedef struct {
    uint64_t key; /* parent << 8 | byte, EMPTY_KEY = free */
    uint32_t child;
    uint32_t unused;
} Edge;

static inline uint64_t slot_of(uint64_t key, uint64_t mask) {
    return (key * 0x9E3779B97F4A7C15ULL >> 17) & mask;
}

typedef struct {
    uint64_t nnodes, nedges, nslots_hash;
    int64_t *value; /* per node */
    Edge *edges;    /* hash of edges */
} Builder;

static void builder_free(Builder *b) {
    PyMem_RawFree(b->value);
    PyMem_RawFree(b->edges);
}

/* Insert the patterns; node 0 is the root. 0 on success, -1 with an exception set. */
static int build_hash(Builder *b, PyObject *pseq, PyObject *vseq, Py_ssize_t n, uint64_t *maxlen) {
    uint64_t bound = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(pseq, i);
        if (!PyBytes_Check(p) || PyBytes_GET_SIZE(p) == 0) {
            PyErr_SetString(PyExc_TypeError, "each pattern must be non-empty bytes");
            return -1;
        }
        bound += (uint64_t)PyBytes_GET_SIZE(p);
    }
    if (bound > MAX_SLOTS / 2) {
        PyErr_SetString(PyExc_ValueError, "patterns too large for one trie");
        return -1;
    }
    uint64_t nslots = 1024;
    while (nslots < bound + bound / 2) nslots <<= 1;
    b->value = PyMem_RawMalloc(sizeof(int64_t) * (size_t)bound);
    b->edges = PyMem_RawMalloc(sizeof(Edge) * (size_t)nslots);
    if (!b->value || !b->edges) {
        PyErr_NoMemory();
        return -1;
    }
    memset(b->edges, 0xFF, sizeof(Edge) * (size_t)nslots);
    b->nslots_hash = nslots;
    b->value[0] = NO_VALUE;
    uint64_t nodes = 1, mask = nslots - 1;
    *maxlen = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(pseq, i);
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(vseq, i));
        if (v == -1 && PyErr_Occurred()) return -1;
        if (v < -1) {
            PyErr_SetString(PyExc_ValueError, "values must be ids >= 0 or -1");
            return -1;
        }
        const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(p);
        Py_ssize_t len = PyBytes_GET_SIZE(p);
        if ((uint64_t)len > *maxlen) *maxlen = (uint64_t)len;
        uint64_t node = 0;
        for (Py_ssize_t j = 0; j < len; j++) {
            uint64_t key = (node << 8) | s[j];
            uint64_t at = slot_of(key, mask);
            Edge *e = &b->edges[at];
            while (e->key != EMPTY_KEY && e->key != key) {
                at = (at + 1) & mask;
                e = &b->edges[at];
            }
            if (e->key == EMPTY_KEY) {
                e->key = key;
                e->child = (uint32_t)nodes;
                b->value[nodes] = NO_VALUE;
                nodes++;
            }
            node = e->child;
        }
        if (b->value[node] != NO_VALUE) {
            PyErr_Format(PyExc_ValueError, "pattern %zd is listed twice", i);
            return -1;
        }
        b->value[node] = (int64_t)v;
    }
    b->nnodes = nodes;
    b->nedges = nodes - 1;
    return 0;
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static int slots_grow(Slot **slots, uint64_t *cap, uint64_t need) {
    if (need <= *cap) return 0;
    uint64_t more = *cap * 2;
    if (more < need) more = need;
    if (more > MAX_SLOTS) {
        PyErr_SetString(PyExc_ValueError, "patterns too large for one trie");
        return -1;
    }
    Slot *grown = PyMem_RawRealloc(*slots, sizeof(Slot) * (size_t)more);
    if (!grown) {
        PyErr_NoMemory();
        return -1;
    }
    for (uint64_t i = *cap; i < more; i++) grown[i] = (Slot){0, -1, NO_VALUE};
    *slots = grown;
    *cap = more;
    return 0;
}

/* The double array of a built hash trie: nodes in breadth-first order, each placed at the
 * first base where all its children's slots are free. */
static int build_double_array(TrieObject *t, Builder *b) {
    int rc = -1;
    uint64_t ne = b->nedges, nn = b->nnodes;
    /* Edges sorted by (parent, byte): the children of each node, in byte order. */
    uint64_t *keys = PyMem_RawMalloc(sizeof(uint64_t) * (size_t)(ne ? ne : 1));
    uint32_t *child_of = NULL, *first = NULL, *queue = NULL, *where = NULL;
    int64_t *nxt = NULL, *prv = NULL;
    Slot *slots = NULL;
    uint64_t cap = 0;
    if (!keys) goto nomem;
    uint64_t k = 0;
    for (uint64_t i = 0; i < b->nslots_hash; i++)
        if (b->edges[i].key != EMPTY_KEY) keys[k++] = b->edges[i].key;
    qsort(keys, (size_t)ne, sizeof(uint64_t), cmp_u64);
    child_of = PyMem_RawMalloc(sizeof(uint32_t) * (size_t)(ne ? ne : 1));
    first = PyMem_RawMalloc(sizeof(uint32_t) * (size_t)(nn + 1));
    queue = PyMem_RawMalloc(sizeof(uint32_t) * (size_t)nn);
    where = PyMem_RawMalloc(sizeof(uint32_t) * (size_t)nn);
    if (!child_of || !first || !queue || !where) goto nomem;
    uint64_t mask = b->nslots_hash - 1;
    for (uint64_t i = 0; i < ne; i++) { /* the child of each sorted edge */
        uint64_t at = slot_of(keys[i], mask);
        while (b->edges[at].key != keys[i]) at = (at + 1) & mask;
        child_of[i] = b->edges[at].child;
    }
    for (uint64_t i = 0, e = 0; i <= nn; i++) { /* first[node]: its first edge */
        while (e < ne && (keys[e] >> 8) < i) e++;
        first[i] = (uint32_t)e;
    }
    cap = nn + 512;
    if (slots_grow(&slots, &(uint64_t){0}, cap) < 0) goto done;
    nxt = PyMem_RawMalloc(sizeof(int64_t) * (size_t)cap);
    prv = PyMem_RawMalloc(sizeof(int64_t) * (size_t)cap);
    if (!nxt || !prv) goto nomem;
    /* A doubly linked list of the free slots, so placing a node visits free slots only. */
    for (uint64_t i = 1; i < cap; i++) {
        nxt[i] = i + 1 < cap ? (int64_t)i + 1 : -1;
        prv[i] = i > 1 ? (int64_t)i - 1 : -1;
    }
    int64_t free_head = 1, free_tail = (int64_t)cap - 1;
    slots[0] = (Slot){0, 0, b->value[0]}; /* the root: its own parent, never a child */
    where[0] = 0;
    uint64_t head = 0, tail = 0;
    queue[tail++] = 0;
    while (head < tail) {
        uint32_t node = queue[head++];
        uint32_t e0 = first[node], e1 = first[node + 1];
        if (e0 == e1) continue; /* a leaf: base 0 leads nowhere (check never matches) */
        uint32_t lo = (uint32_t)(keys[e0] & 0xFF);
        uint64_t base = 0;
        for (int64_t f = free_head;; f = nxt[f]) {
            if (f == -1 || (uint64_t)f + 256 > cap) { /* grow, then go on from the new slots */
                uint64_t old = cap;
                if (slots_grow(&slots, &cap, cap + cap / 2 + 512) < 0) goto done;
                int64_t *gn = PyMem_RawRealloc(nxt, sizeof(int64_t) * (size_t)cap);
                if (!gn) goto nomem;
                nxt = gn;
                int64_t *gp = PyMem_RawRealloc(prv, sizeof(int64_t) * (size_t)cap);
                if (!gp) goto nomem;
                prv = gp;
                for (uint64_t i = old; i < cap; i++) {
                    nxt[i] = i + 1 < cap ? (int64_t)i + 1 : -1;
                    prv[i] = i > old ? (int64_t)i - 1 : free_tail;
                }
                if (free_tail >= 0) nxt[free_tail] = (int64_t)old;
                else free_head = (int64_t)old;
                free_tail = (int64_t)cap - 1;
                if (f == -1) f = (int64_t)old;
            }
            if ((uint64_t)f < lo + 1) continue;
            base = (uint64_t)f - lo; /* two nodes may share a base: check tells them apart */
            uint32_t e = e0 + 1;
            for (; e < e1; e++)
                if (slots[base + (keys[e] & 0xFF)].check != -1) break;
            if (e == e1) break;
        }
        slots[where[node]].base = (int32_t)base;
        for (uint32_t e = e0; e < e1; e++) {
            uint64_t at = base + (keys[e] & 0xFF);
            uint32_t c = child_of[e];
            slots[at].check = (int32_t)where[node];
            slots[at].value = b->value[c];
            where[c] = (uint32_t)at;
            queue[tail++] = c;
            /* unlink the slot from the free list */
            int64_t pn = prv[at], nn2 = nxt[at];
            if (pn >= 0) nxt[pn] = nn2;
            else free_head = nn2;
            if (nn2 >= 0) prv[nn2] = pn;
            else free_tail = pn;
        }
    }
    /* Trim to the last used slot + 256, so every base + byte stays inside. */
    uint64_t last = 0;
    for (uint64_t i = 0; i < cap; i++)
        if (slots[i].check != -1 && (uint64_t)slots[i].base > last) last = (uint64_t)slots[i].base;
    uint64_t size = last + 256 > nn ? last + 256 : nn;
    if (size > cap) size = cap;
    t->slots = PyMem_RawRealloc(slots, sizeof(Slot) * (size_t)size);
    if (!t->slots) {
        t->slots = slots;
        size = cap;
    }
    slots = NULL;
    t->nslots = size;
    rc = 0;
    goto done;
nomem:
    PyErr_NoMemory();
done:
    PyMem_RawFree(keys);
    PyMem_RawFree(child_of);
    PyMem_RawFree(first);
    PyMem_RawFree(queue);
    PyMem_RawFree(where);
    PyMem_RawFree(nxt);
    PyMem_RawFree(prv);
    PyMem_RawFree(slots);
    return rc;
}

/* Trie(patterns: sequence of bytes, values: sequence of int) */
static int Trie_init(TrieObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"patterns", "values", NULL};
    PyObject *patterns, *values;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "OO", kwlist, &patterns, &values)) return -1;
    PyObject *pseq = PySequence_Fast(patterns, "patterns must be a sequence of bytes");
    if (!pseq) return -1;
    PyObject *vseq = PySequence_Fast(values, "values must be a sequence of int");
    if (!vseq) {
        Py_DECREF(pseq);
        return -1;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(pseq);
    Builder b = {0, 0, 0, NULL, NULL};
    if (self->slots) { /* other threads may be matching with it, without the GIL */
        PyErr_SetString(PyExc_TypeError, "Trie is already initialized");
        Py_DECREF(pseq);
        Py_DECREF(vseq);
        return -1;
    }
    uint64_t maxlen = 0;
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(vseq) != n) {
        PyErr_SetString(PyExc_ValueError, "patterns and values differ in length");
        goto done;
    }
    if (build_hash(&b, pseq, vseq, n, &maxlen) < 0) goto done;
    if (build_double_array(self, &b) < 0) goto done;
    self->maxlen = maxlen;
    for (int c = 0; c < 256; c++) {
        uint64_t at = (uint64_t)self->slots[0].base + (uint64_t)c;
        if (self->slots[at].check != 0 || self->slots[at].value == NO_VALUE) {
            PyErr_Format(PyExc_ValueError, "byte 0x%02x is not a pattern", c);
            PyMem_RawFree(self->slots);
            self->slots = NULL;
            goto done;
        }
    }
    rc = 0;
done:
    builder_free(&b);
    Py_DECREF(pseq);
    Py_DECREF(vseq);
    return rc;
}

static int trie_ready(TrieObject *t) {
    if (t->slots == NULL) {
        PyErr_SetString(PyExc_ValueError, "trie not initialized");
        return 0;
    }
    return 1;
}

/* match(data, limit, itemsize) -> (ids: bytes of native uint16, uint32 or int64 by itemsize 2,
 * 4 or 8, consumed: int)
 * Greedy leftmost-longest from the start of data; stops before the first match starting after
 * `limit` (pass len(data) to match everything). Matches whose value is -1 give no id. */
static PyObject *Trie_match(TrieObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t limit;
    int itemsize;
    if (!trie_ready(self)) return NULL;
    if (!PyArg_ParseTuple(args, "y*ni", &buf, &limit, &itemsize)) return NULL;
    if (itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "itemsize must be 2, 4 or 8");
        return NULL;
    }
    Py_ssize_t n = buf.len, cap = n / 3 + 64, k = 0, pos = 0;
    int64_t *ids = PyMem_RawMalloc(sizeof(int64_t) * (size_t)cap);
    if (!ids) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    const uint8_t *d = (const uint8_t *)buf.buf;
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    const Slot *slots = self->slots;
    const int32_t root_base = slots[0].base;
    while (pos < n && pos <= limit) {
        int32_t s = root_base + d[pos];
        int64_t best = slots[s].value;
        Py_ssize_t best_end = pos + 1, p = pos + 1;
        while (p < n) {
            int32_t t = slots[s].base + d[p];
            if (slots[t].check != s) break;
            s = t;
            p++;
            if (slots[s].value != NO_VALUE) {
                best = slots[s].value;
                best_end = p;
            }
        }
        if (best >= 0) {
            if (k == cap) {
                Py_ssize_t more = cap + cap / 2;
                int64_t *grown = PyMem_RawRealloc(ids, sizeof(int64_t) * (size_t)more);
                if (!grown) {
                    nomem = 1;
                    break;
                }
                ids = grown;
                cap = more;
            }
            ids[k++] = best;
        }
        pos = best_end;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (nomem) {
        PyMem_RawFree(ids);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, k * itemsize);
    if (out) { /* narrowing is exact: the caller picks an itemsize every id fits in */
        char *w = PyBytes_AS_STRING(out);
        if (itemsize == 8) {
            memcpy(w, ids, (size_t)k * 8);
        } else if (itemsize == 4) {
            for (Py_ssize_t i = 0; i < k; i++) ((uint32_t *)w)[i] = (uint32_t)ids[i];
        } else {
            for (Py_ssize_t i = 0; i < k; i++) ((uint16_t *)w)[i] = (uint16_t)ids[i];
        }
    }
    PyMem_RawFree(ids);
    if (!out) return NULL;
    return Py_BuildValue("(Nn)", out, pos);
}

/* match_docs(docs, itemsize, eos) -> (ids: bytes, counts: bytes of native int64)
 * Many documents in one call (ingest docs' batches): each of `docs` (a sequence of bytes-like
 * objects) is matched whole, exactly as match(doc, len(doc), itemsize) matches it, and the ids
 * of all of them follow one another in one buffer of native uint16, uint32 or int64 by
 * `itemsize`, with `eos` (when it is >= 0) after the ids of every document that gave at least
 * one id. counts[i] is the number of ids document i gave, its eos not counted. The ids are
 * written at their width as they are found: no int64 scratch, one output buffer. */
static PyObject *Trie_match_docs(TrieObject *self, PyObject *args) {
    PyObject *docs, *seq;
    int itemsize;
    long long eos;
    if (!trie_ready(self)) return NULL;
    if (!PyArg_ParseTuple(args, "OiL", &docs, &itemsize, &eos)) return NULL;
    if (itemsize != 2 && itemsize != 4 && itemsize != 8) {
        PyErr_SetString(PyExc_ValueError, "itemsize must be 2, 4 or 8");
        return NULL;
    }
    if ((itemsize == 2 && eos > UINT16_MAX) || (itemsize == 4 && eos > UINT32_MAX)) {
        PyErr_SetString(PyExc_ValueError, "eos does not fit itemsize");
        return NULL;
    }
    seq = PySequence_Fast(docs, "docs must be a sequence of bytes-like objects");
    if (!seq) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), got = 0;
    Py_buffer *bufs = PyMem_Calloc((size_t)(n ? n : 1), sizeof(Py_buffer));
    int64_t *counts = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    char *out = NULL;
    PyObject *ids_obj = NULL, *counts_obj = NULL;
    if (!bufs || !counts) {
        PyErr_NoMemory();
        goto done;
    }
    size_t total = 0;
    for (; got < n; got++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
        total += (size_t)bufs[got].len;
    }
    /* The ids go straight into the bytes object returned (no scratch copied into it after),
     * sized for half an id a byte, about a third more than the bundled map gives; grown, with
     * the GIL taken back for the moment, when a batch gives more, and cut to the ids found. */
    size_t cap = total / 2 + (size_t)n + 64, k = 0;
    ids_obj = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)(cap * (size_t)itemsize));
    if (!ids_obj) goto done;
    out = PyBytes_AS_STRING(ids_obj);
    int nomem = 0;
    Py_BEGIN_ALLOW_THREADS
    const Slot *slots = self->slots;
    const int32_t root_base = slots[0].base;
    for (Py_ssize_t i = 0; i < n && !nomem; i++) {
        const uint8_t *d = (const uint8_t *)bufs[i].buf;
        Py_ssize_t len = bufs[i].len, pos = 0;
        size_t first = k;
        while (pos < len) {
            int32_t s = root_base + d[pos];
            int64_t best = slots[s].value;
            Py_ssize_t best_end = pos + 1, p = pos + 1;
            while (p < len) {
                int32_t t = slots[s].base + d[p];
                if (slots[t].check != s) break;
                s = t;
                p++;
                if (slots[s].value != NO_VALUE) {
                    best = slots[s].value;
                    best_end = p;
                }
            }
            pos = best_end;
            if (best < 0) continue;
            if (k + 1 >= cap) { /* room for this id and an eos */
                size_t more = cap + cap / 2 + 64;
                Py_BLOCK_THREADS
                nomem = _PyBytes_Resize(&ids_obj, (Py_ssize_t)(more * (size_t)itemsize)) < 0;
                Py_UNBLOCK_THREADS
                if (nomem) break; /* ids_obj is NULL, MemoryError set */
                out = PyBytes_AS_STRING(ids_obj);
                cap = more;
            }
            if (itemsize == 2) ((uint16_t *)out)[k] = (uint16_t)best;
            else if (itemsize == 4) ((uint32_t *)out)[k] = (uint32_t)best;
            else ((int64_t *)out)[k] = best;
            k++;
        }
        counts[i] = (int64_t)(k - first);
        if (k > first && eos >= 0 && !nomem) {
            if (itemsize == 2) ((uint16_t *)out)[k] = (uint16_t)eos;
            else if (itemsize == 4) ((uint32_t *)out)[k] = (uint32_t)eos;
            else ((int64_t *)out)[k] = (int64_t)eos;
            k++;
        }
    }
    Py_END_ALLOW_THREADS
    if (nomem) goto done;
    if (_PyBytes_Resize(&ids_obj, (Py_ssize_t)(k * (size_t)itemsize)) < 0) goto done;
    counts_obj = PyBytes_FromStringAndSize((const char *)counts, (Py_ssize_t)(sizeof(int64_t) * (size_t)n));
done:
    for (Py_ssize_t i = 0; i < got; i++) PyBuffer_Release(&bufs[i]);
    PyMem_Free(bufs);
    PyMem_RawFree(counts);
    Py_DECREF(seq);
    if (!counts_obj) {
        Py_XDECREF(ids_obj);
        return NULL;
    }
    return Py_BuildValue("(NN)", ids_obj, counts_obj);
}

/* spans(data) -> bytes of native int64 triples (value, start, end), one per match of the
 * greedy leftmost-longest tiling of data, matches whose value is -1 included. */
static PyObject *Trie_spans(TrieObject *self, PyObject *arg) {
    Py_buffer buf;
    if (!trie_ready(self)) return NULL;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    Py_ssize_t n = buf.len, pos = 0, k = 0;
    PyObject *out = PyBytes_FromStringAndSize(NULL, (n ? n : 1) * 3 * (Py_ssize_t)sizeof(int64_t));
    if (!out) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    int64_t *w = (int64_t *)PyBytes_AS_STRING(out);
    const uint8_t *d = (const uint8_t *)buf.buf;
    const Slot *slots = self->slots;
    while (pos < n) { /* at most one match per byte, so the output fits */
        int32_t s = slots[0].base + d[pos];
        int64_t best = slots[s].value;
        Py_ssize_t best_end = pos + 1, p = pos + 1;
        while (p < n) {
            int32_t t = slots[s].base + d[p];
            if (slots[t].check != s) break;
            s = t;
            p++;
            if (slots[s].value != NO_VALUE) {
                best = slots[s].value;
                best_end = p;
            }
        }
        w[k++] = best;
        w[k++] = pos;
        w[k++] = best_end;
        pos = best_end;
    }
    PyBuffer_Release(&buf);
    if (_PyBytes_Resize(&out, k * (Py_ssize_t)sizeof(int64_t)) < 0) return NULL;
    return out;
}

/* cut(data, start, stop) -> the first position p in [start, stop) where the greedy tiling of
 * ANY text containing data has a token boundary, whatever comes before or after data; -1 when
 * there is none. p qualifies when no pattern occurrence spans it: for every s in
 * [p - maxlen + 1, p - 1] (all inside data, so p >= maxlen - 1), the trie walk from s reaches no
 * pattern end beyond p, and dies before the end of data (a walk that runs off the end could
 * continue in the next bytes). Every byte is a pattern, so the token covering byte p - 1 then
 * ends at p; and tokenizing the parts before and after p alone gives the same tokens
 * (docs/formats/pi-symbol-map.md, "Parallel encoding"). */
static PyObject *Trie_cut(TrieObject *self, PyObject *args) {
    Py_buffer buf;
    Py_ssize_t start, stop, found = -1;
    if (!trie_ready(self)) return NULL;
    if (!PyArg_ParseTuple(args, "y*nn", &buf, &start, &stop)) return NULL;
    Py_ssize_t n = buf.len, reach = (Py_ssize_t)self->maxlen - 1;
    if (start < reach) start = reach;
    if (start < 1) start = 1;
    if (stop > n) stop = n;
    const uint8_t *d = (const uint8_t *)buf.buf;
    Py_BEGIN_ALLOW_THREADS
    const Slot *slots = self->slots;
    for (Py_ssize_t p = start; p < stop && found < 0; p++) {
        int spans = 0;
        for (Py_ssize_t s = p - 1; s >= p - reach && s >= 0 && !spans; s--) {
            int32_t node = slots[0].base + d[s];
            Py_ssize_t q = s + 1; /* bytes [s, q) walked */
            for (;;) {
                if (q > p && slots[node].value != NO_VALUE) {
                    spans = 1; /* a pattern [s, q) covers bytes p - 1 and p */
                    break;
                }
                if (q == n) {
                    spans = q > p || q == p; /* off the end, still on a path: unknown */
                    break;
                }
                int32_t t = slots[node].base + d[q];
                if (slots[t].check != node) break;
                node = t;
                q++;
            }
        }
        if (!spans) found = p;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return PyLong_FromSsize_t(found);
}

static PyObject *Trie_to_bytes(TrieObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!trie_ready(self)) return NULL;
    size_t size = 8 + HEADER_WORDS * 8 + (size_t)self->nslots * sizeof(Slot);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out) return NULL;
    char *w = PyBytes_AS_STRING(out);
    uint64_t head[HEADER_WORDS] = {self->nslots, self->maxlen, 0, 0};
    memcpy(w, MAGIC, 8);
    memcpy(w + 8, head, sizeof(head));
    memcpy(w + 8 + sizeof(head), self->slots, (size_t)self->nslots * sizeof(Slot));
    return out;
}

/* Trie.from_bytes(data): the inverse of to_bytes; ValueError when anything is out of bounds:
 * every base + 255 and every check inside the array, every value an id, -1 or NO_VALUE, and
 * the root with a child that has a value for every byte. */
static PyObject *Trie_from_bytes(PyObject *cls, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const char *r = buf.buf;
    size_t len = (size_t)buf.len, fixed = 8 + HEADER_WORDS * 8;
    uint64_t head[HEADER_WORDS];
    TrieObject *t = NULL;
    if (len < fixed || memcmp(r, MAGIC, 8) != 0) goto bad;
    memcpy(head, r + 8, sizeof(head));
    uint64_t nslots = head[0];
    if (nslots < 257 || nslots > MAX_SLOTS || head[1] == 0 || head[1] > 1 << 20) goto bad;
    if (len != fixed + nslots * sizeof(Slot)) goto bad;
    t = (TrieObject *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    if (!t) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    t->slots = PyMem_RawMalloc(sizeof(Slot) * (size_t)nslots);
    if (!t->slots) {
        Py_DECREF(t);
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    memcpy(t->slots, r + fixed, (size_t)nslots * sizeof(Slot));
    t->nslots = nslots;
    t->maxlen = head[1];
    for (uint64_t i = 0; i < nslots; i++) {
        const Slot *x = &t->slots[i];
        if (x->base < 0 || (uint64_t)x->base + 256 > nslots || x->check < -1 ||
            (x->check >= 0 && (uint64_t)x->check >= nslots) ||
            (x->value < -1 && x->value != NO_VALUE))
            goto bad;
    }
    if (t->slots[0].check != 0) goto bad;
    for (int c = 0; c < 256; c++) {
        const Slot *x = &t->slots[t->slots[0].base + c];
        if (x->check != 0 || x->value == NO_VALUE) goto bad;
    }
    PyBuffer_Release(&buf);
    return (PyObject *)t;
bad:
    Py_XDECREF(t);
    PyBuffer_Release(&buf);
    PyErr_SetString(PyExc_ValueError, "not a valid compiled trie");
    return NULL;
}

static PyObject *Trie_get_lookahead(TrieObject *self, void *Py_UNUSED(closure)) {
    if (!trie_ready(self)) return NULL;
    return PyLong_FromUnsignedLongLong(self->maxlen);
}

static PyMethodDef Trie_methods[] = {
    {"match", (PyCFunction)Trie_match, METH_VARARGS,
     "match(data, limit, itemsize) -> (ids as bytes, bytes consumed)"},
    {"match_docs", (PyCFunction)Trie_match_docs, METH_VARARGS,
     "match_docs(docs, itemsize, eos) -> (ids of every document, eos after each, as bytes; "
     "each document's id count as native int64 bytes)"},
    {"cut", (PyCFunction)Trie_cut, METH_VARARGS,
     "cut(data, start, stop) -> the first position in [start, stop) no pattern spans, or -1."},
    {"spans", (PyCFunction)Trie_spans, METH_O,
     "spans(data) -> int64 (value, start, end) triples of every match, as bytes"},
    {"to_bytes", (PyCFunction)Trie_to_bytes, METH_NOARGS, "The trie as bytes."},
    {"from_bytes", (PyCFunction)Trie_from_bytes, METH_O | METH_CLASS,
     "A trie from to_bytes() output (checked)."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef Trie_getset[] = {
    {"lookahead", (getter)Trie_get_lookahead, NULL, "The longest pattern, in bytes.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject TrieType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "matrixctl._pi_kernel.Trie",
    .tp_basicsize = sizeof(TrieObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Trie(patterns, values): greedy leftmost-longest matcher over bytes.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Trie_init,
    .tp_dealloc = (destructor)Trie_dealloc,
    .tp_methods = Trie_methods,
    .tp_getset = Trie_getset,
};

/* ---- decode table -------------------------------------------------------------------- */

/* One 16-byte record per id: its length and up to 15 bytes inline, so joining copies a fixed
 * 16 bytes per token and advances by the length. Longer texts live in `blob`. */
#define INLINE 15
#define LONG_MARK 255
#define MISSING_MARK 254

typedef struct {
    PyObject_HEAD
    Py_ssize_t size;  /* number of ids */
    uint8_t *recs;    /* (size + 1) * 16: a spare record, as a 16-byte copy reads one byte on */
    Py_ssize_t *offs; /* size + 1 offsets into blob, for long texts */
    char *blob;
} TableObject;

static void Table_dealloc(TableObject *self) {
    PyMem_RawFree(self->recs);
    PyMem_RawFree(self->offs);
    PyMem_RawFree(self->blob);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* Table(parts): parts[i] is the bytes of id i, or None when id i has no text. */
static int Table_init(TableObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"parts", NULL};
    PyObject *parts;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "O", kwlist, &parts)) return -1;
    if (self->recs) { /* other threads may be joining with it, without the GIL */
        PyErr_SetString(PyExc_TypeError, "Table is already initialized");
        return -1;
    }
    PyObject *seq = PySequence_Fast(parts, "parts must be a sequence");
    if (!seq) return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq), total = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(seq, i);
        if (p == Py_None) continue;
        if (!PyBytes_Check(p)) {
            Py_DECREF(seq);
            PyErr_SetString(PyExc_TypeError, "parts must be bytes or None");
            return -1;
        }
        if (PyBytes_GET_SIZE(p) > INLINE) total += PyBytes_GET_SIZE(p);
    }
    self->recs = PyMem_RawCalloc((size_t)(n + 1), 16);
    self->offs = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(n + 1));
    self->blob = PyMem_RawMalloc((size_t)(total ? total : 1));
    if (!self->recs || !self->offs || !self->blob) {
        PyMem_RawFree(self->recs);
        PyMem_RawFree(self->offs);
        PyMem_RawFree(self->blob);
        self->recs = NULL;
        self->offs = NULL;
        self->blob = NULL;
        Py_DECREF(seq);
        PyErr_NoMemory();
        return -1;
    }
    Py_ssize_t at = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(seq, i);
        uint8_t *rec = self->recs + 16 * i;
        self->offs[i] = at;
        if (p == Py_None) {
            rec[0] = MISSING_MARK;
            continue;
        }
        Py_ssize_t len = PyBytes_GET_SIZE(p);
        if (len <= INLINE) {
            rec[0] = (uint8_t)len;
            memcpy(rec + 1, PyBytes_AS_STRING(p), (size_t)len);
        } else {
            rec[0] = LONG_MARK;
            memcpy(self->blob + at, PyBytes_AS_STRING(p), (size_t)len);
            at += len;
        }
    }
    self->offs[n] = at;
    self->size = n;
    Py_DECREF(seq);
    return 0;
}

static inline int64_t id_at(const char *p, Py_ssize_t i, int itemsize) {
    switch (itemsize) {
    case 2: return ((const uint16_t *)p)[i];
    case 4: return ((const uint32_t *)p)[i];
    default: return ((const int64_t *)p)[i];
    }
}

/* Grow `*out` to hold at least `need` bytes; 0 on success. */
static inline int grow_to(char **out, size_t *cap, size_t need) {
    size_t more = *cap + *cap / 2;
    if (more < need) more = need;
    char *grown = PyMem_RawRealloc(*out, more);
    if (!grown) return -1;
    *out = grown;
    *cap = more;
    return 0;
}

/* join(ids, itemsize, replacement) -> (bytes, index of the first id with no text or -1).
 * ids: a buffer of uint16 (itemsize 2), uint32 (4) or int64 (8). With replacement (bytes),
 * ids with no text give it; with None, joining stops at the first such id. */
static PyObject *Table_join(TableObject *self, PyObject *args) {
    Py_buffer buf;
    int itemsize;
    PyObject *rep;
    if (!self->recs) {
        PyErr_SetString(PyExc_ValueError, "table not initialized");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "y*iO", &buf, &itemsize, &rep)) return NULL;
    if ((itemsize != 2 && itemsize != 4 && itemsize != 8) || buf.len % itemsize ||
        (rep != Py_None && !PyBytes_Check(rep))) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "ids must be uint16, uint32 or int64; replacement bytes");
        return NULL;
    }
    Py_ssize_t n = buf.len / itemsize, size = self->size, bad = -1;
    const char *rp = rep == Py_None ? NULL : PyBytes_AS_STRING(rep);
    Py_ssize_t rlen = rep == Py_None ? 0 : PyBytes_GET_SIZE(rep);
    size_t cap = (size_t)n * 4 + 64, w = 0;
    char *out = PyMem_RawMalloc(cap);
    if (!out) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    int nomem = 0;
    const uint8_t *recs = self->recs;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t v = id_at(buf.buf, i, itemsize);
        const uint8_t *rec = (v >= 0 && v < size) ? recs + 16 * v : NULL;
        if (rec && rec[0] <= INLINE) {
            if (w + 16 > cap && grow_to(&out, &cap, w + 16) < 0) {
                nomem = 1;
                break;
            }
            memcpy(out + w, rec + 1, 16);
            w += rec[0];
            continue;
        }
        size_t len;
        const char *src;
        if (!rec || rec[0] == MISSING_MARK) {
            if (bad < 0) bad = i;
            if (!rp) break;
            src = rp;
            len = (size_t)rlen;
        } else { /* LONG_MARK: offsets advance only past long texts */
            src = self->blob + self->offs[v];
            len = (size_t)(self->offs[v + 1] - self->offs[v]);
        }
        if (w + len + 16 > cap && grow_to(&out, &cap, w + len + 16) < 0) {
            nomem = 1;
            break;
        }
        memcpy(out + w, src, len);
        w += len;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (nomem) {
        PyMem_RawFree(out);
        return PyErr_NoMemory();
    }
    PyObject *res = PyBytes_FromStringAndSize(out, (Py_ssize_t)w);
    PyMem_RawFree(out);
    if (!res) return NULL;
    return Py_BuildValue("(Nn)", res, bad);
}

static PyMethodDef Table_methods[] = {
    {"join", (PyCFunction)Table_join, METH_VARARGS,
     "join(ids, itemsize, replacement) -> (bytes, first id index with no text or -1)"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject TableType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "matrixctl._pi_kernel.Table",
    .tp_basicsize = sizeof(TableObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Table(parts): the bytes of each id, joined for arrays of ids.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Table_init,
    .tp_dealloc = (destructor)Table_dealloc,
    .tp_methods = Table_methods,
};

/* ---- normalization segments ---------------------------------------------------------- */

/* segments(text, gap) -> [a0, b0, a1, b1, ...]: the parts of `text` that normalization can
 * change. ASCII text is stable under every form, and a cut before an ASCII character is safe
 * (it never combines with what precedes it), so only each run of non-ASCII characters, with
 * the character before it (a base its combining marks may compose with), needs normalizing.
 * Segments closer than `gap` characters are merged. */
static PyObject *segments(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *text;
    Py_ssize_t gap;
    if (!PyArg_ParseTuple(args, "Un", &text, &gap)) return NULL;
    int kind = PyUnicode_KIND(text);
    const void *data = PyUnicode_DATA(text);
    Py_ssize_t n = PyUnicode_GET_LENGTH(text), i = 0;
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    Py_ssize_t a = -1, b = -1; /* the open segment */
    while (i < n) {
        if (PyUnicode_READ(kind, data, i) < 0x80) {
            i++;
            continue;
        }
        Py_ssize_t s = i;
        while (i < n && PyUnicode_READ(kind, data, i) >= 0x80) i++;
        Py_ssize_t start = s > 0 ? s - 1 : 0;
        if (a >= 0 && start - b < gap) {
            b = i;
            continue;
        }
        if (a >= 0) {
            PyObject *pa = PyLong_FromSsize_t(a), *pb = PyLong_FromSsize_t(b);
            int bad = !pa || !pb || PyList_Append(out, pa) < 0 || PyList_Append(out, pb) < 0;
            Py_XDECREF(pa);
            Py_XDECREF(pb);
            if (bad) {
                Py_DECREF(out);
                return NULL;
            }
        }
        a = start;
        b = i;
    }
    if (a >= 0) {
        PyObject *pa = PyLong_FromSsize_t(a), *pb = PyLong_FromSsize_t(b);
        int bad = !pa || !pb || PyList_Append(out, pa) < 0 || PyList_Append(out, pb) < 0;
        Py_XDECREF(pa);
        Py_XDECREF(pb);
        if (bad) {
            Py_DECREF(out);
            return NULL;
        }
    }
    return out;
}

/* normalize_runs(text, gap, normalize) -> text with normalize(part) applied to each part
 * segments(text, gap) names and the rest kept: the loop of tokenizers/pi.py's normalize() in C
 * (one call per part, no bytecode between them). A part that comes back as the same object
 * (unicodedata's quick check: already normalized) is not copied; text itself is returned when
 * no part changed. */
static PyObject *normalize_runs(PyObject *module, PyObject *args) {
    PyObject *text, *func;
    Py_ssize_t gap;
    if (!PyArg_ParseTuple(args, "UnO", &text, &gap, &func)) return NULL;
    PyObject *seg_args = Py_BuildValue("(On)", text, gap);
    if (!seg_args) return NULL;
    PyObject *cuts = segments(module, seg_args);
    Py_DECREF(seg_args);
    if (!cuts) return NULL;
    Py_ssize_t m = PyList_GET_SIZE(cuts), n = PyUnicode_GET_LENGTH(text), last = 0;
    PyObject *parts = PyList_New(0), *out = NULL;
    if (!parts) goto done;
    for (Py_ssize_t k = 0; k + 1 < m; k += 2) {
        Py_ssize_t a = PyLong_AsSsize_t(PyList_GET_ITEM(cuts, k));
        Py_ssize_t b = PyLong_AsSsize_t(PyList_GET_ITEM(cuts, k + 1));
        PyObject *seg = PyUnicode_Substring(text, a, b);
        if (!seg) goto done;
        PyObject *normed = PyObject_CallOneArg(func, seg);
        if (!normed) {
            Py_DECREF(seg);
            goto done;
        }
        if (normed == seg) { /* unchanged: stays in the plain part */
            Py_DECREF(normed);
            Py_DECREF(seg);
            continue;
        }
        Py_DECREF(seg);
        PyObject *plain = PyUnicode_Substring(text, last, a);
        int bad = !plain || PyList_Append(parts, plain) < 0 || PyList_Append(parts, normed) < 0;
        Py_XDECREF(plain);
        Py_DECREF(normed);
        if (bad) goto done;
        last = b;
    }
    if (last == 0 && PyList_GET_SIZE(parts) == 0) {
        Py_INCREF(text);
        out = text;
        goto done;
    }
    PyObject *tail = PyUnicode_Substring(text, last, n);
    if (!tail || PyList_Append(parts, tail) < 0) {
        Py_XDECREF(tail);
        goto done;
    }
    Py_DECREF(tail);
    PyObject *empty = PyUnicode_New(0, 0);
    if (!empty) goto done;
    out = PyUnicode_Join(empty, parts);
    Py_DECREF(empty);
done:
    Py_XDECREF(parts);
    Py_DECREF(cuts);
    return out;
}

static PyMethodDef module_methods[] = {
    {"segments", segments, METH_VARARGS,
     "segments(text, gap) -> [a0, b0, ...]: the parts of text normalization can change."},
    {"normalize_runs", normalize_runs, METH_VARARGS,
     "normalize_runs(text, gap, normalize) -> text with normalize() applied to those parts."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "matrixctl._pi_kernel", "The π tokenizer's compiled kernel.", -1,
    module_methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__pi_kernel(void) {
    if (PyType_Ready(&TrieType) < 0 || PyType_Ready(&TableType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&TrieType);
    Py_INCREF(&TableType);
    if (PyModule_AddObject(m, "Trie", (PyObject *)&TrieType) < 0 ||
        PyModule_AddObject(m, "Table", (PyObject *)&TableType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
