/* The π tokenizer's compiled kernel: greedy leftmost-longest matching over UTF-8 bytes, and
 * decoding of token ids into bytes (docs/formats/pi-symbol-map.md, "Encoding";
 * docs/benchmarks.md for why this is C).
 *
 * Trie: a byte trie of the patterns (the symbols' keys plus every single byte that is not a
 * symbol, so a match starts at every position). Node 0 is the root; its 256 children are a
 * dense table, deeper edges live in one open-addressing hash table keyed by (node, byte).
 * Each node has a value: the id the pattern ending there gives, -1 (the pattern gives no
 * token) or NO_VALUE (no pattern ends there). Matching at a position walks the trie as far as
 * the bytes allow and takes the deepest node with a value: the longest pattern starting there.
 * With a pattern for every single byte, this is exactly leftmost-longest matching.
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
#include <string.h>

#define NO_VALUE INT64_MIN
#define EMPTY_KEY UINT64_MAX
#define MAGIC "PITRIE01"
#define HEADER_WORDS 4 /* nnodes, nslots, maxlen, reserved (uint64 each) */

typedef struct {
    uint64_t key;   /* node << 8 | byte, EMPTY_KEY = free */
    uint32_t child; /* the node that edge leads to */
    uint32_t unused;
} Edge;

typedef struct {
    PyObject_HEAD
    uint64_t nnodes;
    uint64_t nslots; /* power of two */
    uint64_t maxlen;
    uint32_t root[256]; /* child of the root for each byte, 0 = none */
    int64_t *value;     /* nnodes */
    Edge *edges;        /* nslots */
    uint32_t *l2;       /* 65536: child of root[b0] for byte b1, 0 = none */
} TrieObject;

static inline uint64_t slot_of(uint64_t key, uint64_t mask) {
    return (key * 0x9E3779B97F4A7C15ULL >> 17) & mask;
}

static inline uint32_t trie_step(const TrieObject *t, uint32_t node, uint8_t byte) {
    uint64_t key = ((uint64_t)node << 8) | byte;
    uint64_t mask = t->nslots - 1;
    uint64_t s = slot_of(key, mask);
    for (;;) {
        const Edge *e = &t->edges[s];
        if (e->key == key) return e->child;
        if (e->key == EMPTY_KEY) return 0;
        s = (s + 1) & mask;
    }
}

static void trie_free_arrays(TrieObject *t) {
    PyMem_RawFree(t->value);
    PyMem_RawFree(t->edges);
    PyMem_RawFree(t->l2);
    t->value = NULL;
    t->edges = NULL;
    t->l2 = NULL;
}

static void Trie_dealloc(TrieObject *self) {
    trie_free_arrays(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int trie_alloc(TrieObject *t, uint64_t nnodes, uint64_t nslots) {
    if (nnodes > UINT32_MAX || nslots > ((uint64_t)1 << 40)) {
        PyErr_SetString(PyExc_ValueError, "trie too large");
        return -1;
    }
    t->value = PyMem_RawMalloc(sizeof(int64_t) * (size_t)(nnodes ? nnodes : 1));
    t->edges = PyMem_RawMalloc(sizeof(Edge) * (size_t)nslots);
    t->l2 = PyMem_RawMalloc(sizeof(uint32_t) * 65536);
    if (!t->value || !t->edges || !t->l2) {
        trie_free_arrays(t);
        PyErr_NoMemory();
        return -1;
    }
    t->nnodes = nnodes;
    t->nslots = nslots;
    return 0;
}

/* After building: a hash table sized for the edges there are (load <= 1/2), and the dense
 * second-level table. */
static int trie_compact(TrieObject *t) {
    uint64_t used = 0, nslots = 1024;
    for (uint64_t s = 0; s < t->nslots; s++) used += t->edges[s].key != EMPTY_KEY;
    while (nslots < 2 * used) nslots <<= 1;
    Edge *edges = PyMem_RawMalloc(sizeof(Edge) * (size_t)nslots);
    if (!edges) {
        PyErr_NoMemory();
        return -1;
    }
    memset(edges, 0xFF, sizeof(Edge) * (size_t)nslots);
    uint64_t mask = nslots - 1;
    for (uint64_t s = 0; s < t->nslots; s++) {
        Edge e = t->edges[s];
        if (e.key == EMPTY_KEY) continue;
        uint64_t at = slot_of(e.key, mask);
        while (edges[at].key != EMPTY_KEY) at = (at + 1) & mask;
        edges[at] = e;
    }
    PyMem_RawFree(t->edges);
    t->edges = edges;
    t->nslots = nslots;
    for (int b0 = 0; b0 < 256; b0++)
        for (int b1 = 0; b1 < 256; b1++)
            t->l2[b0 * 256 + b1] = trie_step(t, t->root[b0], (uint8_t)b1);
    return 0;
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
    int rc = -1;
    if (PySequence_Fast_GET_SIZE(vseq) != n) {
        PyErr_SetString(PyExc_ValueError, "patterns and values differ in length");
        goto done;
    }
    /* Upper bound on nodes: 1 + total pattern bytes. */
    uint64_t bound = 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(pseq, i);
        if (!PyBytes_Check(p) || PyBytes_GET_SIZE(p) == 0) {
            PyErr_SetString(PyExc_TypeError, "each pattern must be non-empty bytes");
            goto done;
        }
        bound += (uint64_t)PyBytes_GET_SIZE(p);
    }
    uint64_t nslots = 1024;
    while (nslots < bound + bound / 2) nslots <<= 1;
    trie_free_arrays(self);
    if (trie_alloc(self, bound, nslots) < 0) goto done;
    memset(self->edges, 0xFF, sizeof(Edge) * (size_t)nslots);
    memset(self->root, 0, sizeof(self->root));
    self->value[0] = NO_VALUE;
    uint64_t nodes = 1, maxlen = 0, mask = nslots - 1;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(pseq, i);
        long long v = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(vseq, i));
        if (v == -1 && PyErr_Occurred()) goto done;
        if (v < -1) {
            PyErr_SetString(PyExc_ValueError, "values must be ids >= 0 or -1");
            goto done;
        }
        const uint8_t *s = (const uint8_t *)PyBytes_AS_STRING(p);
        Py_ssize_t len = PyBytes_GET_SIZE(p);
        if ((uint64_t)len > maxlen) maxlen = (uint64_t)len;
        uint32_t node = self->root[s[0]];
        if (node == 0) {
            node = (uint32_t)nodes++;
            self->value[node] = NO_VALUE;
            self->root[s[0]] = node;
        }
        for (Py_ssize_t j = 1; j < len; j++) {
            uint64_t key = ((uint64_t)node << 8) | s[j];
            uint64_t at = slot_of(key, mask);
            Edge *e = &self->edges[at];
            while (e->key != EMPTY_KEY && e->key != key) {
                at = (at + 1) & mask;
                e = &self->edges[at];
            }
            if (e->key == EMPTY_KEY) {
                e->key = key;
                e->child = (uint32_t)nodes;
                self->value[nodes] = NO_VALUE;
                nodes++;
            }
            node = e->child;
        }
        if (self->value[node] != NO_VALUE) {
            PyErr_Format(PyExc_ValueError, "pattern %zd is listed twice", i);
            goto done;
        }
        self->value[node] = (int64_t)v;
    }
    for (int b = 0; b < 256; b++) {
        if (self->root[b] == 0 || self->value[self->root[b]] == NO_VALUE) {
            PyErr_Format(PyExc_ValueError, "byte 0x%02x is not a pattern", b);
            goto done;
        }
    }
    self->nnodes = nodes;
    self->maxlen = maxlen;
    if (trie_compact(self) < 0) goto done;
    rc = 0;
done:
    Py_DECREF(pseq);
    Py_DECREF(vseq);
    return rc;
}

static int trie_ready(TrieObject *t) {
    if (t->value == NULL) {
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
    const int64_t *value = self->value;
    while (pos < n && pos <= limit) {
        uint32_t node = self->root[d[pos]];
        int64_t best = value[node];
        Py_ssize_t best_end = pos + 1, p = pos + 1;
        if (p < n && (node = self->l2[d[pos] * 256 + d[p]]) != 0) {
            p++;
            if (value[node] != NO_VALUE) {
                best = value[node];
                best_end = p;
            }
        } else {
            p = n; /* no second byte, or no pattern continues with it */
        }
        while (p < n) {
            node = trie_step(self, node, d[p]);
            if (node == 0) break;
            p++;
            if (value[node] != NO_VALUE) {
                best = value[node];
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

static PyObject *Trie_to_bytes(TrieObject *self, PyObject *Py_UNUSED(ignored)) {
    if (!trie_ready(self)) return NULL;
    size_t size = 8 + HEADER_WORDS * 8 + 256 * 4 + (size_t)self->nnodes * 8 +
                  (size_t)self->nslots * sizeof(Edge);
    PyObject *out = PyBytes_FromStringAndSize(NULL, (Py_ssize_t)size);
    if (!out) return NULL;
    char *w = PyBytes_AS_STRING(out);
    uint64_t head[HEADER_WORDS] = {self->nnodes, self->nslots, self->maxlen, 0};
    memcpy(w, MAGIC, 8);
    w += 8;
    memcpy(w, head, sizeof(head));
    w += sizeof(head);
    memcpy(w, self->root, sizeof(self->root));
    w += sizeof(self->root);
    memcpy(w, self->value, (size_t)self->nnodes * 8);
    w += (size_t)self->nnodes * 8;
    memcpy(w, self->edges, (size_t)self->nslots * sizeof(Edge));
    return out;
}

static PyTypeObject TrieType;

/* Trie.from_bytes(data): the inverse of to_bytes; ValueError when anything is out of bounds. */
static PyObject *Trie_from_bytes(PyObject *cls, PyObject *arg) {
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const char *r = buf.buf;
    size_t len = (size_t)buf.len, fixed = 8 + HEADER_WORDS * 8 + 256 * 4;
    uint64_t head[HEADER_WORDS];
    TrieObject *t = NULL;
    if (len < fixed || memcmp(r, MAGIC, 8) != 0) goto bad;
    memcpy(head, r + 8, sizeof(head));
    uint64_t nnodes = head[0], nslots = head[1];
    if (nnodes < 257 || nnodes > UINT32_MAX || nslots < 1024 || (nslots & (nslots - 1)) ||
        nslots > ((uint64_t)1 << 40) || head[2] == 0 || head[2] > 1 << 20)
        goto bad;
    if (len != fixed + nnodes * 8 + nslots * sizeof(Edge)) goto bad;
    t = (TrieObject *)((PyTypeObject *)cls)->tp_alloc((PyTypeObject *)cls, 0);
    if (!t) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    if (trie_alloc(t, nnodes, nslots) < 0) {
        Py_DECREF(t);
        PyBuffer_Release(&buf);
        return NULL;
    }
    t->maxlen = head[2];
    r += 8 + sizeof(head);
    memcpy(t->root, r, sizeof(t->root));
    r += sizeof(t->root);
    memcpy(t->value, r, (size_t)nnodes * 8);
    r += (size_t)nnodes * 8;
    memcpy(t->edges, r, (size_t)nslots * sizeof(Edge));
    for (int b = 0; b < 256; b++)
        if (t->root[b] == 0 || t->root[b] >= nnodes || t->value[t->root[b]] == NO_VALUE) goto bad;
    for (uint64_t i = 0; i < nnodes; i++)
        if (t->value[i] < -1 && t->value[i] != NO_VALUE) goto bad;
    uint64_t used = 0;
    for (uint64_t s = 0; s < nslots; s++) {
        const Edge *e = &t->edges[s];
        if (e->key == EMPTY_KEY) continue;
        used++;
        if ((e->key >> 8) >= nnodes || e->child == 0 || e->child >= nnodes) goto bad;
    }
    if (used == nslots) goto bad; /* a full table would make lookups loop forever */
    for (int b0 = 0; b0 < 256; b0++)
        for (int b1 = 0; b1 < 256; b1++)
            t->l2[b0 * 256 + b1] = trie_step(t, t->root[b0], (uint8_t)b1);
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
    PyMem_RawFree(self->recs);
    PyMem_RawFree(self->offs);
    PyMem_RawFree(self->blob);
    self->recs = PyMem_RawCalloc((size_t)(n + 1), 16);
    self->offs = PyMem_RawMalloc(sizeof(Py_ssize_t) * (size_t)(n + 1));
    self->blob = PyMem_RawMalloc((size_t)(total ? total : 1));
    if (!self->recs || !self->offs || !self->blob) {
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

static PyMethodDef module_methods[] = {
    {"segments", segments, METH_VARARGS,
     "segments(text, gap) -> [a0, b0, ...]: the parts of text normalization can change."},
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
