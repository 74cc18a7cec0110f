/* CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) over any buffer, the zTensor digest
 * (docs/benchmarks.md, "convert against cp, zTensor reads", for why this is C).
 *
 * `crc32c(data, value=0)` continues a finished CRC-32C `value` over `data`, like
 * google_crc32c.extend, but takes every object with the buffer protocol (memoryview slices of
 * a mapped file included, which google_crc32c refuses), so a digest needs neither a copy nor
 * numpy. On x86-64 with SSE 4.2 the CRC32 instruction runs three independent streams over
 * 3 x 4 KiB blocks and joins them with shift tables (the instruction's latency is 3 cycles, its
 * throughput 1); elsewhere a slicing-by-8 table loop. Both give the same values. The GIL is
 * released for buffers of 64 KiB and more.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the slicing-by-8 loop reads little-endian 64-bit words"
#endif

#define POLY 0x82F63B78u
#define BLOCK 4096
#define NOGIL_MIN (64 * 1024)

static uint32_t table[8][256];

static void build_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ POLY : c >> 1;
        table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            table[t][i] = (table[t - 1][i] >> 8) ^ table[0][table[t - 1][i] & 0xFF];
}

/* The register (not inverted) continued over n bytes. */
static uint32_t crc_table(uint32_t crc, const uint8_t *p, size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        v ^= crc;
        crc = table[7][v & 0xFF] ^ table[6][(v >> 8) & 0xFF] ^ table[5][(v >> 16) & 0xFF] ^
              table[4][(v >> 24) & 0xFF] ^ table[3][(v >> 32) & 0xFF] ^
              table[2][(v >> 40) & 0xFF] ^ table[1][(v >> 48) & 0xFF] ^ table[0][v >> 56];
        p += 8;
        n -= 8;
    }
    while (n--) crc = table[0][(crc ^ *p++) & 0xFF] ^ (crc >> 8);
    return crc;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <nmmintrin.h>
#define HAVE_HW 1

static int hw_ok;
static uint32_t shift_block[4][256]; /* the register after BLOCK zero bytes, by byte of it */

__attribute__((target("sse4.2"))) static uint32_t crc_hw_1(uint32_t crc, const uint8_t *p,
                                                            size_t n) {
    uint64_t c = crc;
    while (n && ((uintptr_t)p & 7)) {
        c = _mm_crc32_u8((uint32_t)c, *p++);
        n--;
    }
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, p, 8);
        c = _mm_crc32_u64(c, v);
        p += 8;
        n -= 8;
    }
    while (n--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

static uint32_t shift(uint32_t crc) {
    return shift_block[0][crc & 0xFF] ^ shift_block[1][(crc >> 8) & 0xFF] ^
           shift_block[2][(crc >> 16) & 0xFF] ^ shift_block[3][crc >> 24];
}

static void build_shift(void) {
    /* Zero bytes act linearly on the register: shift each of its 32 bits through BLOCK zeros
     * once, and a table entry is the XOR of the shifted bits of its byte. */
    static const uint8_t zeros[BLOCK];
    uint32_t bit[32];
    for (int i = 0; i < 32; i++) bit[i] = crc_hw_1(1u << i, zeros, BLOCK);
    for (int k = 0; k < 4; k++)
        for (uint32_t b = 0; b < 256; b++) {
            uint32_t v = 0;
            for (int j = 0; j < 8; j++)
                if (b >> j & 1) v ^= bit[8 * k + j];
            shift_block[k][b] = v;
        }
}

__attribute__((target("sse4.2"))) static uint32_t crc_hw(uint32_t crc, const uint8_t *p,
                                                          size_t n) {
    while (n && ((uintptr_t)p & 7)) {
        crc = _mm_crc32_u8(crc, *p++);
        n--;
    }
    while (n >= 3 * BLOCK) {
        uint64_t a = crc, b = 0, c = 0;
        const uint8_t *q = p;
        for (size_t i = 0; i < BLOCK; i += 8) {
            uint64_t va, vb, vc;
            memcpy(&va, q + i, 8);
            memcpy(&vb, q + BLOCK + i, 8);
            memcpy(&vc, q + 2 * BLOCK + i, 8);
            a = _mm_crc32_u64(a, va);
            b = _mm_crc32_u64(b, vb);
            c = _mm_crc32_u64(c, vc);
        }
        crc = shift(shift((uint32_t)a) ^ (uint32_t)b) ^ (uint32_t)c;
        p += 3 * BLOCK;
        n -= 3 * BLOCK;
    }
    return crc_hw_1(crc, p, n);
}
#else
#define HAVE_HW 0
#endif

static uint32_t crc_any(uint32_t crc, const uint8_t *p, size_t n) {
#if HAVE_HW
    if (hw_ok) return crc_hw(crc, p, n);
#endif
    return crc_table(crc, p, n);
}

static PyObject *run(PyObject *args, const char *spec,
                     uint32_t (*fn)(uint32_t, const uint8_t *, size_t)) {
    Py_buffer view;
    unsigned long value = 0;
    if (!PyArg_ParseTuple(args, spec, &view, &value)) return NULL;
    uint32_t crc = (uint32_t)value ^ 0xFFFFFFFFu;
    const uint8_t *p = (const uint8_t *)view.buf;
    size_t n = (size_t)view.len;
    if (n >= NOGIL_MIN) {
        Py_BEGIN_ALLOW_THREADS
        crc = fn(crc, p, n);
        Py_END_ALLOW_THREADS
    } else {
        crc = fn(crc, p, n);
    }
    PyBuffer_Release(&view);
    return PyLong_FromUnsignedLong((unsigned long)(crc ^ 0xFFFFFFFFu));
}

static PyObject *py_crc32c(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, "y*|k:crc32c", crc_any);
}

static PyObject *py_crc32c_table(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, "y*|k:crc32c_table", crc_table);
}

static PyObject *py_backend(PyObject *self, PyObject *unused) {
    (void)self;
    (void)unused;
#if HAVE_HW
    if (hw_ok) return PyUnicode_FromString("sse4.2");
#endif
    return PyUnicode_FromString("table");
}

static PyMethodDef methods[] = {
    {"crc32c", py_crc32c, METH_VARARGS,
     "crc32c(data, value=0): the CRC-32C of a bytes-like object, continuing from a finished "
     "CRC-32C value."},
    {"crc32c_table", py_crc32c_table, METH_VARARGS,
     "crc32c_table(data, value=0): the same through the portable table loop (for tests)."},
    {"backend", py_backend, METH_NOARGS, "backend(): 'sse4.2' or 'table'."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_crc_kernel", "CRC-32C over any buffer.", -1, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__crc_kernel(void) {
    build_tables();
#if HAVE_HW
    __builtin_cpu_init();
    hw_ok = __builtin_cpu_supports("sse4.2");
    if (hw_ok) build_shift();
#endif
    return PyModule_Create(&module);
}
