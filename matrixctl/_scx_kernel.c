/* The SCX tokenizer's compiled kernel: lane lookup, bundle encoding and the decoding of whole
 * canonical bundles (docs/formats/scx.md; docs/benchmarks.md, "SCX kernel", for why this is C).
 *
 * A Codec holds one config's tables, built once and never changed after (threads share it
 * without the GIL):
 *   - the active composite id of a lane's W bytes: a direct table of 2**(8W) ids for W <= 2,
 *     else an open-addressing hash table (linear probing, load <= 1/8) keyed by the lane read
 *     as a little-endian integer, behind a 64 Kibit filter of hash fragments (a lane whose bit
 *     is clear has no composite: one L1 read instead of a probe);
 *   - the W pattern bytes of every id (`expand`), and for every id whether it is an active
 *     composite that the lookup of its own pattern gives back (`canon`).
 *
 * Every method works on buffers with the GIL released, so threads run in parallel, and reads
 * only inside the buffers it was given and the tables (every index is a u16 id or is checked).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the SCX kernel reads and writes little-endian u16 tokens in place"
#endif

#define TOKEN_LIMIT 65536
#define MAX_WIDTH 8
#define BUNDLE_START 0x0100
#define BUNDLE_END 0x0101
#define LANE_MARK 0x0103
#define SHARD_START 0x0200
#define SHARD_END 0x0201
#define CHUNK_MARK 0x0203
#define SCRATCH_MAX ((Py_ssize_t)4 << 20) /* the largest scratch buffer a Codec keeps */
#define SCRATCH_SLOTS 4                     /* scratch buffers a Codec keeps (threads)  */
#define POOL_MAX ((Py_ssize_t)4 << 20) /* the largest TokenBuffer block a Codec keeps */
#define POOL_SLOTS 128                    /* spare TokenBuffer blocks a Codec keeps      */
#define HASH_MULT 0x9E3779B97F4A7C15ULL
#define HOT static inline __attribute__((always_inline))

typedef struct {
    PyObject_HEAD
    int width;
    Py_ssize_t lanes;
    uint16_t *direct;   /* W <= 2: id by lane key, 2**(8W) entries */
    uint64_t *hkeys;    /* W > 2: hash table keys */
    uint16_t *hids;     /* ... and ids (0: empty slot) */
    int hbits;
    uint64_t filter[1024]; /* W > 2: a bit per 16-bit hash fragment of the keys (no bit: no key) */
    uint8_t *expand;    /* TOKEN_LIMIT * width pattern bytes */
    uint8_t *canon;     /* TOKEN_LIMIT flags: an active composite its pattern's lookup gives */
    /* Output buffers reused from call to call (see take_scratch); NULL until first used. */
    uint8_t *scratch[SCRATCH_SLOTS];
    Py_ssize_t scratch_size[SCRATCH_SLOTS];
    int scratch_busy[SCRATCH_SLOTS]; /* taken (only ever changed with the GIL held) */
    /* Spare memory of TokenBuffers (encode_blocks): pool_n blocks of pool_size bytes. */
    uint8_t *pool[POOL_SLOTS];
    Py_ssize_t pool_size;
    int pool_n;
} CodecObject;

static void pool_clear(CodecObject *c) {
    while (c->pool_n > 0) PyMem_RawFree(c->pool[--c->pool_n]);
}

static void Codec_dealloc(CodecObject *self) {
    PyMem_RawFree(self->direct);
    PyMem_RawFree(self->hkeys);
    PyMem_RawFree(self->hids);
    PyMem_RawFree(self->expand);
    PyMem_RawFree(self->canon);
    for (int s = 0; s < SCRATCH_SLOTS; s++) PyMem_RawFree(self->scratch[s]);
    pool_clear(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static inline uint64_t lane_key(const uint8_t *p, int w) {
    uint64_t k = 0;
    for (int i = 0; i < w; i++) k |= (uint64_t)p[i] << (8 * i);
    return k;
}

/* The active composite id of the lane whose key (little-endian integer) is `key`, 0 when none. */
HOT uint16_t lookup_key(const CodecObject *c, uint64_t key) {
    if (c->direct) return c->direct[key];
    if (!c->hids) return 0;
    uint64_t h = key * HASH_MULT, f = (h >> 24) & 0xFFFF;
    if (!(c->filter[f >> 6] >> (f & 63) & 1)) return 0; /* most lanes have no composite */
    uint64_t mask = ((uint64_t)1 << c->hbits) - 1;
    uint64_t s = h >> (64 - c->hbits);
    while (c->hids[s]) {
        if (c->hkeys[s] == key) return c->hids[s];
        s = (s + 1) & mask;
    }
    return 0;
}

/* The active composite id of the lane at p, 0 when none. */
HOT uint16_t lookup_w(const CodecObject *c, const uint8_t *p, const int w) {
    return lookup_key(c, lane_key(p, w));
}

static inline uint16_t lookup(const CodecObject *c, const uint8_t *p) {
    return lookup_key(c, lane_key(p, c->width));
}

static void insert(CodecObject *c, const uint8_t *p, uint16_t id) {
    int w = c->width;
    if (c->direct) {
        c->direct[w == 1 ? p[0] : (uint32_t)p[0] | (uint32_t)p[1] << 8] = id;
        return;
    }
    uint64_t key = lane_key(p, w);
    uint64_t mask = ((uint64_t)1 << c->hbits) - 1;
    uint64_t h = key * HASH_MULT, f = (h >> 24) & 0xFFFF;
    uint64_t s = h >> (64 - c->hbits);
    c->filter[f >> 6] |= (uint64_t)1 << (f & 63);
    while (c->hids[s] && c->hkeys[s] != key) s = (s + 1) & mask;
    c->hkeys[s] = key; /* a later composite with the same pattern wins, as in a dict */
    c->hids[s] = id;
}

/* Codec(width, lanes, expand, active): expand is TOKEN_LIMIT * width bytes (the pattern of
 * every id), active TOKEN_LIMIT bytes (1 for the active composites, in id order). */
static int Codec_init(CodecObject *self, PyObject *args, PyObject *kwds) {
    static char *kwlist[] = {"width", "lanes", "expand", "active", NULL};
    int width;
    Py_ssize_t lanes;
    Py_buffer ex, ac;
    if (!PyArg_ParseTupleAndKeywords(args, kwds, "iny*y*", kwlist, &width, &lanes, &ex, &ac))
        return -1;
    int ok = 0;
    if (self->expand) {
        PyErr_SetString(PyExc_TypeError, "Codec is already initialized");
    } else if (width < 1 || width > MAX_WIDTH || lanes < 1 || lanes > (1 << 24)) {
        PyErr_SetString(PyExc_ValueError, "lane width must be 1-8 and lanes 1-2**24");
    } else if (ex.len != (Py_ssize_t)TOKEN_LIMIT * width || ac.len != TOKEN_LIMIT) {
        PyErr_SetString(PyExc_ValueError, "expand must be 65536 * width bytes, active 65536");
    } else {
        ok = 1;
    }
    if (!ok) {
        PyBuffer_Release(&ex);
        PyBuffer_Release(&ac);
        return -1;
    }
    const uint8_t *act = ac.buf;
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < TOKEN_LIMIT; i++) n += act[i] != 0;
    self->width = width;
    self->lanes = lanes;
    self->expand = PyMem_RawCalloc((size_t)TOKEN_LIMIT * (size_t)width + 8, 1); /* +8: word reads */
    self->canon = PyMem_RawCalloc(TOKEN_LIMIT, 1);
    int nomem = !self->expand || !self->canon;
    if (!nomem && width <= 2) {
        self->direct = PyMem_RawCalloc((size_t)1 << (8 * width), sizeof(uint16_t));
        nomem = !self->direct;
    } else if (!nomem && n) {
        int bits = 4;
        while (((Py_ssize_t)1 << bits) < 8 * n) bits++; /* load <= 1/8: short probes */
        self->hbits = bits;
        self->hkeys = PyMem_RawCalloc((size_t)1 << bits, sizeof(uint64_t));
        self->hids = PyMem_RawCalloc((size_t)1 << bits, sizeof(uint16_t));
        nomem = !self->hkeys || !self->hids;
    }
    if (nomem) {
        PyBuffer_Release(&ex);
        PyBuffer_Release(&ac);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(self->expand, ex.buf, (size_t)TOKEN_LIMIT * (size_t)width);
    for (Py_ssize_t i = 0; i < TOKEN_LIMIT; i++)
        if (act[i]) insert(self, self->expand + i * width, (uint16_t)i);
    for (Py_ssize_t i = 0; i < TOKEN_LIMIT; i++)
        self->canon[i] = act[i] && lookup(self, self->expand + i * width) == i;
    PyBuffer_Release(&ex);
    PyBuffer_Release(&ac);
    return 0;
}

static int ready(CodecObject *self) {
    if (!self->expand) {
        PyErr_SetString(PyExc_ValueError, "Codec not initialized");
        return 0;
    }
    return 1;
}

/* A free scratch buffer of at least `size` bytes for one call, grown when short; its slot in
 * *slot. NULL (and *slot -1) when every slot is taken or size > SCRATCH_MAX: the caller then
 * allocates its own. The GIL must be held (it guards the busy flags).
 *
 * Why: an output buffer of the worst-case size, fresh for every call, is fresh memory (for
 * SCXQ4 text about 2.5x what decode writes), and the allocator hands blocks of this size out
 * as new mappings, so every 4 KiB written cost a page fault; a kept buffer is already in
 * memory, and the copy into an exact-size bytes object costs less than the faults did. */
static uint8_t *take_scratch(CodecObject *c, Py_ssize_t size, int *slot) {
    *slot = -1;
    if (size > SCRATCH_MAX) return NULL;
    for (int s = 0; s < SCRATCH_SLOTS; s++) {
        if (c->scratch_busy[s]) continue;
        if (c->scratch_size[s] < size) {
            PyMem_RawFree(c->scratch[s]);
            c->scratch[s] = PyMem_RawMalloc(size);
            c->scratch_size[s] = c->scratch[s] ? size : 0;
            if (!c->scratch[s]) return NULL;
        }
        c->scratch_busy[s] = 1;
        *slot = s;
        return c->scratch[s];
    }
    return NULL;
}

static void give_scratch(CodecObject *c, int slot) {
    if (slot >= 0) c->scratch_busy[slot] = 0;
}

/* lookup(data) -> bytes: the active composite id (u16) of every whole lane of data, 0 when
 * none; data must be whole lanes. */
static PyObject *Codec_lookup(CodecObject *self, PyObject *args) {
    Py_buffer buf;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    int w = self->width;
    if (buf.len % w) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "data must be whole lanes");
        return NULL;
    }
    Py_ssize_t n = buf.len / w;
    PyObject *out = PyBytes_FromStringAndSize(NULL, 2 * n);
    if (!out) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    uint16_t *ids = (uint16_t *)PyBytes_AS_STRING(out);
    const uint8_t *p = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) ids[i] = lookup(self, p + i * w);
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return out;
}

/* The tokens of nb whole bundles at p into o (room for 5 + N * (W + 1) per bundle); returns
 * how many. Bundle j = first + b opens a shard when j % shard == 0 and closes it when
 * (j + 1) % shard == 0 (shard 0: no shard markers); counters, not divisions, track both.
 * Branch-free per lane: the W byte tokens are written, then the first replaced by the
 * composite id when there is one, and the cursor moves by 1 or W. */
HOT Py_ssize_t encode_run(const CodecObject *c, const uint8_t *p, Py_ssize_t nb, long long first,
                          int debug, long long chunk, long long shard, uint16_t *o, const int w) {
    Py_ssize_t n = c->lanes, k = 0;
    long long in_chunk = first % chunk, in_shard = shard ? first % shard : 1;
    for (Py_ssize_t b = 0; b < nb; b++) {
        if (in_shard == 0) o[k++] = SHARD_START;
        if (debug && in_chunk == 0) o[k++] = CHUNK_MARK;
        o[k++] = BUNDLE_START;
        for (Py_ssize_t l = 0; l < n; l++, p += w) {
            if (debug) o[k++] = LANE_MARK;
            uint16_t id = lookup_w(c, p, w);
            for (int i = 0; i < w; i++) o[k + i] = p[i];
            o[k] = id ? id : p[0];
            k += id ? 1 : w;
        }
        o[k++] = BUNDLE_END;
        if (++in_chunk == chunk) in_chunk = 0;
        if (shard && ++in_shard == shard) {
            o[k++] = SHARD_END;
            in_shard = 0;
        }
    }
    return k;
}

/* encode(data, first_bundle, debug, chunk_bundles, shard_bundles=0) -> bytes of u16 tokens for
 * whole bundles: per bundle j [SHARD_START when shard_bundles and j is a multiple of it]
 * [CHUNK_MARK when debug and j is a multiple of chunk_bundles] BUNDLE_START, per lane
 * [LANE_MARK when debug] the lane's active composite or its W byte tokens, BUNDLE_END
 * [SHARD_END when shard_bundles and j + 1 is a multiple of it]. The framing of a block of the
 * stream, all made without the GIL. */
static PyObject *Codec_encode(CodecObject *self, PyObject *args) {
    Py_buffer buf;
    long long first;
    int debug;
    long long chunk, shard = 0;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*LpL|L", &buf, &first, &debug, &chunk, &shard))
        return NULL;
    int w = self->width;
    Py_ssize_t n = self->lanes, bb = n * w;
    if (buf.len % bb || first < 0 || chunk < 1 || shard < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError,
                        "data must be whole bundles; first >= 0, chunk >= 1, shard >= 0");
        return NULL;
    }
    Py_ssize_t nb = buf.len / bb;
    Py_ssize_t per = 5 + n * (w + 1); /* the most tokens one bundle takes */
    /* Into a scratch buffer, then copied at its exact size (take_scratch); without one, into
     * a bytes object of the worst-case size, shrunk after. */
    int slot;
    PyObject *out = NULL;
    uint16_t *o = (uint16_t *)take_scratch(self, 2 * nb * per, &slot);
    if (!o) {
        out = PyBytes_FromStringAndSize(NULL, 2 * nb * per);
        if (!out) {
            PyBuffer_Release(&buf);
            return NULL;
        }
        o = (uint16_t *)PyBytes_AS_STRING(out);
    }
    const uint8_t *p = buf.buf;
    Py_ssize_t k = 0;
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 1: k = encode_run(self, p, nb, first, debug, chunk, shard, o, 1); break;
    case 2: k = encode_run(self, p, nb, first, debug, chunk, shard, o, 2); break;
    case 4: k = encode_run(self, p, nb, first, debug, chunk, shard, o, 4); break;
    case 8: k = encode_run(self, p, nb, first, debug, chunk, shard, o, 8); break;
    default: k = encode_run(self, p, nb, first, debug, chunk, shard, o, w); break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    if (slot >= 0) {
        out = PyBytes_FromStringAndSize((const char *)o, 2 * k);
        give_scratch(self, slot);
        return out;
    }
    if (_PyBytes_Resize(&out, 2 * k) < 0) return NULL;
    return out;
}

/* TokenBuffer: the tokens of a block encode_blocks made, read-only through the buffer protocol
 * (numpy's frombuffer takes it), in a block of memory that goes back to its Codec's pool when the last
 * reference goes (only ever with the GIL held), so the next call writes into memory already in
 * place. Why: a fresh output block for every call is fresh memory, and the allocator gives and
 * takes back blocks of this size from the system, so every 4 KiB written cost a page fault
 * (with two encode threads, up to a third of the CPU time went to them), and a kept scratch
 * buffer costs a copy into a new bytes object, made with the GIL held. Blocks are all pool_size
 * bytes (the largest asked for, up to POOL_MAX); at most POOL_SLOTS spare ones are kept. */
typedef struct {
    PyObject_HEAD
    CodecObject *owner; /* a reference: the pool outlives its blocks */
    uint8_t *mem;
    Py_ssize_t size;    /* bytes of the block */
    Py_ssize_t len;     /* bytes of tokens in it */
} TokenBufferObject;

static void TokenBuffer_dealloc(TokenBufferObject *self) {
    CodecObject *c = self->owner;
    if (self->mem) {
        if (c && self->size == c->pool_size && c->pool_n < POOL_SLOTS)
            c->pool[c->pool_n++] = self->mem;
        else
            PyMem_RawFree(self->mem);
    }
    Py_XDECREF(c);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int TokenBuffer_getbuffer(TokenBufferObject *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, self->mem, self->len, 1, flags);
}

static Py_ssize_t TokenBuffer_len(TokenBufferObject *self) { return self->len; }

static PyBufferProcs TokenBuffer_as_buffer = {(getbufferproc)TokenBuffer_getbuffer, NULL};
static PySequenceMethods TokenBuffer_as_sequence = {.sq_length = (lenfunc)TokenBuffer_len};

static PyTypeObject TokenBufferType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "matrixctl._scx_kernel.TokenBuffer",
    .tp_basicsize = sizeof(TokenBufferObject),
    .tp_dealloc = (destructor)TokenBuffer_dealloc,
    .tp_as_buffer = &TokenBuffer_as_buffer,
    .tp_as_sequence = &TokenBuffer_as_sequence,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Tokens from Codec.encode_blocks (u16, read-only buffer; len() in bytes).",
};

/* A block of at least `size` bytes for a TokenBuffer (GIL held): a spare one from the pool, or
 * a new one of pool_size bytes; *got is the block's size. NULL with MemoryError. */
static uint8_t *pool_take(CodecObject *c, Py_ssize_t size, Py_ssize_t *got) {
    if (size > POOL_MAX) {
        *got = size;
    } else {
        if (size > c->pool_size) { /* larger blocks from now on: the spares are too small */
            pool_clear(c);
            c->pool_size = size;
        }
        if (c->pool_n > 0) {
            *got = c->pool_size;
            return c->pool[--c->pool_n];
        }
        *got = c->pool_size;
    }
    uint8_t *mem = PyMem_RawMalloc(*got > 0 ? *got : 1);
    if (!mem) PyErr_NoMemory();
    return mem;
}

/* A new TokenBuffer of `owner` with a pooled block for `size` bytes of tokens (GIL held). */
static TokenBufferObject *token_buffer_new(CodecObject *owner, Py_ssize_t size) {
    TokenBufferObject *out = PyObject_New(TokenBufferObject, &TokenBufferType);
    if (!out) return NULL;
    out->owner = NULL;
    out->len = 0;
    out->mem = pool_take(owner, size, &out->size);
    if (!out->mem) {
        Py_DECREF(out);
        return NULL;
    }
    Py_INCREF(owner);
    out->owner = owner;
    return out;
}

/* encode_blocks(data, first_bundle, debug, chunk_bundles, shard_bundles, block_bundles) ->
 * list of TokenBuffers: the tokens `encode` gives, cut after every `block_bundles` bundles
 * (0: one block, however long) and written straight into pooled blocks (no copy, no fresh
 * pages). All the blocks are made in one call with the GIL released once: a thread that
 * encodes a long range wants the GIL back once, not once per block (with two threads and a
 * main thread handing out work, every reacquisition could wait for another's Python). */
static PyObject *Codec_encode_blocks(CodecObject *self, PyObject *args) {
    Py_buffer buf;
    long long first;
    int debug;
    long long chunk, shard, block;
    if (!ready(self) ||
        !PyArg_ParseTuple(args, "y*LpLLL", &buf, &first, &debug, &chunk, &shard, &block))
        return NULL;
    int w = self->width;
    Py_ssize_t n = self->lanes, bb = n * w;
    if (buf.len % bb || first < 0 || chunk < 1 || shard < 0 || block < 0) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "data must be whole bundles; first >= 0, chunk >= 1, "
                                          "shard >= 0, block >= 0");
        return NULL;
    }
    Py_ssize_t nb = buf.len / bb;
    Py_ssize_t step = block == 0 || block > nb ? nb : (Py_ssize_t)block; /* bundles per block */
    Py_ssize_t count = nb == 0 ? block == 0 : (nb + step - 1) / step; /* empty: 1 block or 0 */
    Py_ssize_t per = 5 + n * (w + 1); /* the most tokens one bundle takes */
    PyObject *list = PyList_New(count);
    if (!list) {
        PyBuffer_Release(&buf);
        return NULL;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        TokenBufferObject *tb = token_buffer_new(self, 2 * step * per);
        if (!tb) {
            Py_DECREF(list); /* the blocks taken so far go back to the pool */
            PyBuffer_Release(&buf);
            return NULL;
        }
        PyList_SET_ITEM(list, i, (PyObject *)tb);
    }
    const uint8_t *p = buf.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < count; i++) {
        TokenBufferObject *tb = (TokenBufferObject *)PyList_GET_ITEM(list, i);
        Py_ssize_t b0 = i * step, k = 0;
        Py_ssize_t m = nb - b0 < step ? nb - b0 : step;
        const uint8_t *q = p + b0 * bb;
        uint16_t *o = (uint16_t *)tb->mem;
        long long f = first + b0;
        switch (w) {
        case 1: k = encode_run(self, q, m, f, debug, chunk, shard, o, 1); break;
        case 2: k = encode_run(self, q, m, f, debug, chunk, shard, o, 2); break;
        case 4: k = encode_run(self, q, m, f, debug, chunk, shard, o, 4); break;
        case 8: k = encode_run(self, q, m, f, debug, chunk, shard, o, 8); break;
        default: k = encode_run(self, q, m, f, debug, chunk, shard, o, w); break;
        }
        tb->len = 2 * k;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    return list;
}

/* The W tokens at t read as a lane: their low bytes as a little-endian integer, and in *high
 * their high bytes (not 0: one of them is not a byte token). W is a constant where this is
 * inlined, so 2, 4 and 8 take one or two word reads and a few shifts, no loop. */
HOT uint64_t pack_lane(const uint16_t *t, const int w, uint64_t *high) {
    uint64_t x, y;
    uint32_t x2;
    switch (w) {
    case 1:
        *high = t[0] >> 8;
        return t[0] & 0xFF;
    case 2:
        memcpy(&x2, t, 4);
        *high = x2 & 0xFF00FF00u;
        x2 &= 0x00FF00FFu;
        return (x2 | x2 >> 8) & 0xFFFFu;
    case 4:
    case 8:
        memcpy(&x, t, 8);
        *high = x & 0xFF00FF00FF00FF00ULL;
        x &= 0x00FF00FF00FF00FFULL;
        x = (x | x >> 8) & 0x0000FFFF0000FFFFULL;
        x = (x | x >> 16) & 0xFFFFFFFFULL;
        if (w == 4) return x;
        memcpy(&y, t + 4, 8);
        *high |= y & 0xFF00FF00FF00FF00ULL;
        y &= 0x00FF00FF00FF00FFULL;
        y = (y | y >> 8) & 0x0000FFFF0000FFFFULL;
        y = (y | y >> 16) & 0xFFFFFFFFULL;
        return x | y << 32;
    default: {
        uint64_t k = 0, h = 0;
        for (int j = 0; j < w; j++) {
            k |= (uint64_t)(t[j] & 0xFF) << (8 * j);
            h |= t[j] >> 8;
        }
        *high = h;
        return k;
    }
    }
}

/* Whether the lane key may have a composite: the direct table's answer for W <= 2, else the
 * filter bit of its hash (clear: no composite; set: `lookup_key` decides). */
HOT int may_have_composite(const CodecObject *c, uint64_t key) {
    if (c->direct) return c->direct[key] != 0;
    uint64_t f = (key * HASH_MULT >> 24) & 0xFFFF;
    return (int)(c->filter[f >> 6] >> (f & 63) & 1);
}

/* Whole canonical bundles of t[0:nt] into o; 1 and the byte and bundle counts when t is
 * exactly such bundles, else 0. o has room for nt / (N + 2) bundles and 8 bytes more. A bundle
 * with N * W + 2 tokens left in the window takes the branch-free lane step (both readings of
 * a lane are made, every read stays in the window; the one branch, into the hash table for a
 * byte lane whose filter bit is set, is rarely taken); a bundle near the end the checked one. */
HOT int decode_run(const CodecObject *c, const uint16_t *t, Py_ssize_t nt, uint8_t *o,
                   Py_ssize_t *pk, Py_ssize_t *pnb, const int w) {
    const uint8_t *expand = c->expand, *canon = c->canon;
    Py_ssize_t n = c->lanes, i = 0, k = 0, nb = 0;
    if (nt == 0) return 0;
    while (i < nt) {
        if (t[i] != BUNDLE_START || nt - i < n + 2) return 0;
        i++;
        if (nt - i >= n * w + 1) {
            uint64_t bad = 0;
            for (Py_ssize_t l = 0; l < n; l++) {
                uint16_t id = t[i];
                uint64_t high, pat;
                uint64_t raw = pack_lane(t + i, w, &high);
                memcpy(&pat, expand + (size_t)id * w, 8);
                int comp = id >= 256;
                /* a composite must be canonical; a byte lane W bytes with no composite */
                bad |= comp ? (uint64_t)!canon[id] : high;
                if (__builtin_expect(!comp & may_have_composite(c, raw), 0))
                    bad |= lookup_key(c, raw) != 0;
                uint64_t v = comp ? pat : raw;
                memcpy(o + k, &v, 8);
                k += w;
                i += comp ? 1 : w;
            }
            if (bad || t[i] != BUNDLE_END) return 0;
            i++;
            nb++;
            continue;
        }
        for (Py_ssize_t l = 0; l < n; l++) {
            uint16_t id = t[i];
            if (id >= 256) {
                if (!canon[id]) return 0;
                memcpy(o + k, expand + (size_t)id * w, (size_t)w);
                i++;
            } else {
                if (nt - i < w) return 0;
                for (int j = 0; j < w; j++) {
                    if (t[i + j] >= 256) return 0;
                    o[k + j] = (uint8_t)t[i + j];
                }
                if (lookup_w(c, o + k, w)) return 0; /* a lane with a composite must use it */
                i += w;
            }
            k += w;
            if (i >= nt) return 0;
        }
        if (t[i] != BUNDLE_END) return 0;
        i++;
        nb++;
    }
    *pk = k;
    *pnb = nb;
    return 1;
}

/* decode(tokens) -> (bytes, bundles) when tokens (u16) are exactly whole bundles in canonical
 * form without debug markers: BUNDLE_START, N lanes, BUNDLE_END, again and again, each lane
 * the active composite of its bytes or, when its bytes have none, its W byte tokens; None for
 * anything else (an empty buffer too): the caller then finds and names the problem. */
static PyObject *Codec_decode(CodecObject *self, PyObject *args) {
    Py_buffer buf;
    if (!ready(self) || !PyArg_ParseTuple(args, "y*", &buf)) return NULL;
    if (buf.len % 2) {
        PyBuffer_Release(&buf);
        PyErr_SetString(PyExc_ValueError, "tokens must be u16");
        return NULL;
    }
    int w = self->width;
    Py_ssize_t n = self->lanes, nt = buf.len / 2;
    /* a bundle takes at least N + 2 tokens; +8: word writes */
    Py_ssize_t cap = nt / (n + 2) * n * w + 8;
    /* Into a scratch buffer, then copied at its exact size (take_scratch); without one, into
     * a buffer of its own. */
    int slot;
    uint8_t *o = take_scratch(self, cap, &slot);
    if (!o) o = PyMem_RawMalloc(cap);
    if (!o) {
        PyBuffer_Release(&buf);
        return PyErr_NoMemory();
    }
    const uint16_t *t = buf.buf;
    Py_ssize_t k = 0, nb = 0;
    int good = 0;
    Py_BEGIN_ALLOW_THREADS
    switch (w) {
    case 1: good = decode_run(self, t, nt, o, &k, &nb, 1); break;
    case 2: good = decode_run(self, t, nt, o, &k, &nb, 2); break;
    case 4: good = decode_run(self, t, nt, o, &k, &nb, 4); break;
    case 8: good = decode_run(self, t, nt, o, &k, &nb, 8); break;
    default: good = decode_run(self, t, nt, o, &k, &nb, w); break;
    }
    Py_END_ALLOW_THREADS
    PyBuffer_Release(&buf);
    PyObject *out = good ? PyBytes_FromStringAndSize((const char *)o, k) : NULL;
    if (slot < 0) PyMem_RawFree(o);
    give_scratch(self, slot);
    if (!good) Py_RETURN_NONE;
    if (!out) return NULL;
    return Py_BuildValue("(Nn)", out, nb);
}

static PyMethodDef Codec_methods[] = {
    {"lookup", (PyCFunction)Codec_lookup, METH_VARARGS,
     "lookup(data) -> u16 bytes: the active composite id of every lane, 0 when none."},
    {"encode", (PyCFunction)Codec_encode, METH_VARARGS,
     "encode(data, first_bundle, debug, chunk_bundles, shard_bundles=0) -> u16 bytes of "
     "whole bundles (with shard markers when shard_bundles)."},
    {"encode_blocks", (PyCFunction)Codec_encode_blocks, METH_VARARGS,
     "encode_blocks(data, first_bundle, debug, chunk_bundles, shard_bundles, block_bundles) -> "
     "list of TokenBuffers: encode's tokens, a block per block_bundles bundles (0: one), in "
     "pooled memory (read-only buffers)."},
    {"decode", (PyCFunction)Codec_decode, METH_VARARGS,
     "decode(tokens) -> (bytes, bundles) for whole canonical bundles, else None."},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject CodecType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "matrixctl._scx_kernel.Codec",
    .tp_basicsize = sizeof(CodecObject),
    .tp_dealloc = (destructor)Codec_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "One SCX config's lane tables: lookup, encode and decode of whole bundles.",
    .tp_methods = Codec_methods,
    .tp_init = (initproc)Codec_init,
    .tp_new = PyType_GenericNew,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "matrixctl._scx_kernel", "The SCX tokenizer's compiled kernel.", -1,
    NULL, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__scx_kernel(void) {
    if (PyType_Ready(&CodecType) < 0 || PyType_Ready(&TokenBufferType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&CodecType);
    if (PyModule_AddObject(m, "Codec", (PyObject *)&CodecType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
