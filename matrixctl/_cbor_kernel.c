/* The strict CBOR decoders of the zTensor manifests (matrixctl/cbor.py is the module API and
 * says what they accept and refuse; docs/benchmarks.md, "zTensor reads in C", says why C).
 *
 * `loads(data, max_items, max_depth, error)`: zTensor v1 (RFC 7049 CBOR, indefinite lengths
 * accepted). `loads_deterministic(data, max_depth, max_items, error)`: zTensor 2 (only the
 * core deterministic encoding of RFC 8949 4.2.1). Both decode exactly one item that fills
 * `data` (any object with the buffer protocol) into dict/list/str/bytes/int/float/bool/None,
 * and raise `error(kind, message, offset)` (cbor.CborError) on the first problem, the offset
 * relative to the start of `data`.
 *
 * Every declared length and count is compared with the bytes left before anything is
 * allocated or looped over; nesting is bounded (so is the C recursion: one level per array or
 * map level); the item count is bounded by `max_items`. Indefinite-length strings (v1) are
 * decoded by one loop without recursion: a string nested inside a chunk is always refused,
 * and only the innermost one decides where (see v1_indefinite_string).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#define MAX_DEPTH_CEILING 1024 /* C recursion: a caller asking for deeper nesting is refused */
#define PREALLOC_MAX 4096      /* arrays longer than this grow as items arrive */
#define CACHE_SLOTS 256        /* short ASCII texts of one decode, shared: a manifest repeats */
#define CACHE_MAX 32           /* its keys ("dtype", "offset", ...) and many values ("f32") */

typedef struct {
    const unsigned char *data;
    Py_ssize_t end;
    long long items;
    long long max_items;
    PyObject *max_items_obj; /* for the message, as the caller wrote it */
    int max_depth;
    PyObject *error; /* cbor.CborError */
    PyObject *texts[CACHE_SLOTS];
} Dec;

/* Errors ---------------------------------------------------------------------------------- */

/* Raise error(kind, message, offset); `message` is stolen. Always returns NULL. */
static PyObject *fail(Dec *d, const char *kind, PyObject *message, Py_ssize_t offset) {
    if (message == NULL) return NULL;
    PyObject *exc = PyObject_CallFunction(d->error, "sNn", kind, message, offset);
    if (exc != NULL) {
        PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
        Py_DECREF(exc);
    }
    return NULL;
}

/* Decimal text of an unsigned 128-bit number (a map's 2 x count can pass 2**64). */
static const char *u128_text(char buf[48], unsigned __int128 v) {
    char *p = buf + 47;
    *p = '\0';
    do {
        *--p = (char)('0' + (int)(v % 10));
        v /= 10;
    } while (v);
    return p;
}

/* "CBOR {what} needs {n} bytes at offset {pos}, only {left} left" (v1) */
static PyObject *v1_short(Dec *d, Py_ssize_t pos, unsigned __int128 n, const char *what) {
    char buf[48];
    return fail(d, "malformed",
                PyUnicode_FromFormat("CBOR %s needs %s bytes at offset %zd, only %zd left", what,
                                     u128_text(buf, n), pos, d->end - pos),
                pos);
}

/* `value` with thousands separators, as Python's format(value, ","). */
static PyObject *commas(PyObject *value) {
    PyObject *spec = PyUnicode_FromString(",");
    if (spec == NULL) return NULL;
    PyObject *text = PyObject_Format(value, spec);
    Py_DECREF(spec);
    return text;
}

static PyObject *commas_u64(uint64_t value) {
    PyObject *num = PyLong_FromUnsignedLongLong(value);
    if (num == NULL) return NULL;
    PyObject *text = commas(num);
    Py_DECREF(num);
    return text;
}

static PyObject *limit_error(Dec *d, Py_ssize_t pos, const char *tail) {
    PyObject *text = commas(d->max_items_obj);
    if (text == NULL) return NULL;
    PyObject *message = PyUnicode_FromFormat("more than %U CBOR items: refusing to decode%s",
                                             text, tail);
    Py_DECREF(text);
    return fail(d, "limit", message, pos);
}

/* Values ---------------------------------------------------------------------------------- */

static uint64_t read_be(const unsigned char *p, int size) {
    uint64_t v = 0;
    for (int i = 0; i < size; i++) v = (v << 8) | p[i];
    return v;
}

static PyObject *negative(uint64_t arg) {
    if (arg <= (uint64_t)LLONG_MAX) return PyLong_FromLongLong(-1 - (long long)arg);
    PyObject *num = PyLong_FromUnsignedLongLong(arg);
    if (num == NULL) return NULL;
    PyObject *out = PyNumber_Invert(num); /* ~n == -1 - n */
    Py_DECREF(num);
    return out;
}

/* data[pos:pos+n] as str; an invalid sequence is "text string is not valid UTF-8 (reason)" at
 * pos + where Python's strict decoder stopped, with its reason. */
static PyObject *text(Dec *d, Py_ssize_t pos, Py_ssize_t n) {
    const unsigned char *p = d->data + pos;
    PyObject **slot = NULL;
    if (n <= CACHE_MAX) {
        /* One str object for each short ASCII text, however often it occurs: fewer objects to
         * allocate, and dict lookups reuse the cached hash. */
        uint32_t h = 2166136261u;
        for (Py_ssize_t i = 0; i < n; i++) h = (h ^ p[i]) * 16777619u;
        slot = &d->texts[(h ^ (h >> 16)) & (CACHE_SLOTS - 1)];
        PyObject *hit = *slot;
        if (hit != NULL && PyUnicode_GET_LENGTH(hit) == n &&
            memcmp(PyUnicode_1BYTE_DATA(hit), p, (size_t)n) == 0) {
            Py_INCREF(hit);
            return hit;
        }
    }
    PyObject *s = PyUnicode_DecodeUTF8((const char *)p, n, "strict");
    if (s != NULL) {
        if (slot != NULL && PyUnicode_IS_ASCII(s)) {
            Py_INCREF(s);
            Py_XSETREF(*slot, s);
        }
        return s;
    }
    if (!PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) return NULL;
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyErr_NormalizeException(&type, &value, &tb);
    Py_ssize_t start = 0;
    PyObject *reason = NULL;
    if (value != NULL && PyUnicodeDecodeError_GetStart(value, &start) == 0)
        reason = PyUnicodeDecodeError_GetReason(value);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    if (reason == NULL) return NULL;
    PyObject *message = PyUnicode_FromFormat("text string is not valid UTF-8 (%U)", reason);
    Py_DECREF(reason);
    return fail(d, "malformed", message, pos + start);
}

/* The float a 2, 4 or 8 byte big-endian argument holds (as struct's ">e", ">f", ">d"). */
static PyObject *float_of(const unsigned char *p, int size) {
    double v = size == 2 ? PyFloat_Unpack2((const char *)p, 0)
               : size == 4 ? PyFloat_Unpack4((const char *)p, 0)
                           : PyFloat_Unpack8((const char *)p, 0);
    if (v == -1.0 && PyErr_Occurred()) return NULL;
    return PyFloat_FromDouble(v);
}

/* zTensor v1 ------------------------------------------------------------------------------ */

static PyObject *v1_value(Dec *d, Py_ssize_t pos, int depth, Py_ssize_t *next);

/* An indefinite-length string whose head ended at `pos`. Its chunks must be definite strings
 * of its major type; each chunk is decoded as an item (counted, checked, UTF-8 for text) before
 * its type is compared, as a recursive decoder would. A chunk that is itself an indefinite
 * string is decoded the same way, one level down; whatever it holds, it ends in an error (its
 * own bad chunk, or "bad chunk" at its head once it completes), so only the innermost level's
 * major type and head offset are needed and the loop keeps just those. */
static PyObject *v1_indefinite_string(Dec *d, int major, Py_ssize_t pos, Py_ssize_t *next) {
    const unsigned char *data = d->data;
    Py_ssize_t end = d->end;
    int level = 0, cur = major;
    Py_ssize_t cur_at = 0;
    PyObject *parts = PyList_New(0);
    if (parts == NULL) return NULL;
    for (;;) {
        if (pos >= end) goto short_chunk;
        if (data[pos] == 0xFF) {
            if (level) goto bad_nested;
            pos++;
            break;
        }
        Py_ssize_t at = pos;
        if (++d->items > d->max_items) {
            Py_DECREF(parts);
            return limit_error(d, pos, " further");
        }
        unsigned ib = data[pos++], mj = ib >> 5, info = ib & 0x1F;
        uint64_t arg = info;
        int indefinite = 0;
        if (info >= 24 && info < 28) {
            int size = 1 << (info - 24);
            if (size > end - pos) {
                Py_DECREF(parts);
                return v1_short(d, pos, (unsigned)size, "argument");
            }
            arg = read_be(data + pos, size);
            pos += size;
        } else if (info == 31 && (mj == 2 || mj == 3 || mj == 4 || mj == 5 || mj == 7)) {
            indefinite = 1;
        } else if (info >= 24) {
            Py_DECREF(parts);
            return fail(d, "malformed",
                        PyUnicode_FromFormat("reserved additional information %u in major type %u",
                                             info, mj),
                        at);
        }
        if (mj == 2 || mj == 3) {
            if (indefinite) {
                level++;
                cur = (int)mj;
                cur_at = at;
                continue;
            }
            if (arg > (uint64_t)(end - pos)) {
                Py_DECREF(parts);
                return v1_short(d, pos, arg, "string");
            }
            if (mj == 3) {
                PyObject *check = text(d, pos, (Py_ssize_t)arg);
                if (check == NULL) {
                    Py_DECREF(parts);
                    return NULL;
                }
                Py_DECREF(check);
            }
            if ((int)mj != cur) goto bad_chunk_at;
            if (!level) {
                PyObject *chunk =
                    PyBytes_FromStringAndSize((const char *)data + pos, (Py_ssize_t)arg);
                if (chunk == NULL || PyList_Append(parts, chunk) < 0) {
                    Py_XDECREF(chunk);
                    Py_DECREF(parts);
                    return NULL;
                }
                Py_DECREF(chunk);
            }
            pos += (Py_ssize_t)arg;
            continue;
        }
        /* Not a string: decoded as an item at the nesting limit, then refused as a chunk. */
        Py_DECREF(parts);
        if (mj == 4 || mj == 5)
            return fail(d, "depth",
                        PyUnicode_FromFormat("CBOR nesting deeper than %d levels", d->max_depth),
                        at);
        if (mj == 6)
            return fail(d, "tag",
                        PyUnicode_FromFormat("CBOR tag %llu is not allowed in a manifest",
                                             (unsigned long long)arg),
                        at);
        if (mj == 7 && !(info >= 20 && info <= 22) && !(info >= 25 && info <= 27))
            return fail(d, "malformed",
                        PyUnicode_FromFormat("CBOR simple value %llu is not allowed in a manifest",
                                             (unsigned long long)arg),
                        at);
        return fail(d, "malformed",
                    PyUnicode_FromString("bad chunk inside an indefinite-length string"), at);
    bad_chunk_at:
        Py_DECREF(parts);
        return fail(d, "malformed",
                    PyUnicode_FromString("bad chunk inside an indefinite-length string"), at);
    }
    {
        Py_ssize_t total = 0, count = PyList_GET_SIZE(parts);
        for (Py_ssize_t i = 0; i < count; i++) total += PyBytes_GET_SIZE(PyList_GET_ITEM(parts, i));
        PyObject *raw = PyBytes_FromStringAndSize(NULL, total);
        if (raw != NULL) {
            char *out = PyBytes_AS_STRING(raw);
            for (Py_ssize_t i = 0; i < count; i++) {
                PyObject *chunk = PyList_GET_ITEM(parts, i);
                memcpy(out, PyBytes_AS_STRING(chunk), (size_t)PyBytes_GET_SIZE(chunk));
                out += PyBytes_GET_SIZE(chunk);
            }
        }
        Py_DECREF(parts);
        if (raw == NULL) return NULL;
        *next = pos;
        if (major == 2) return raw;
        /* Chunks of valid UTF-8 join into valid UTF-8. */
        PyObject *s = PyUnicode_DecodeUTF8(PyBytes_AS_STRING(raw), PyBytes_GET_SIZE(raw), "strict");
        Py_DECREF(raw);
        return s;
    }
short_chunk:
    Py_DECREF(parts);
    return v1_short(d, pos, 1, "string chunk");
bad_nested:
    Py_DECREF(parts);
    return fail(d, "malformed",
                PyUnicode_FromString("bad chunk inside an indefinite-length string"), cur_at);
}

/* One map entry at `pos` into `dict`; the position after it, or -1 with an error set. */
static Py_ssize_t v1_entry(Dec *d, PyObject *dict, Py_ssize_t pos, int depth) {
    Py_ssize_t key_at = pos;
    PyObject *key = v1_value(d, pos, depth + 1, &pos);
    if (key == NULL) return -1;
    if (!PyUnicode_CheckExact(key)) {
        fail(d, "malformed",
             PyUnicode_FromFormat("map key is a %s, manifests use text keys only",
                                  Py_TYPE(key)->tp_name),
             key_at);
        Py_DECREF(key);
        return -1;
    }
    int seen = PyDict_Contains(dict, key);
    if (seen != 0) {
        if (seen > 0) fail(d, "duplicate", PyUnicode_FromFormat("duplicate map key %R", key), key_at);
        Py_DECREF(key);
        return -1;
    }
    PyObject *value = v1_value(d, pos, depth + 1, &pos);
    if (value == NULL) {
        Py_DECREF(key);
        return -1;
    }
    int rc = PyDict_SetItem(dict, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
    return rc < 0 ? -1 : pos;
}

static PyObject *v1_value(Dec *d, Py_ssize_t pos, int depth, Py_ssize_t *next) {
    const unsigned char *data = d->data;
    Py_ssize_t end = d->end;
    if (pos >= end) return v1_short(d, pos, 1, "item head");
    if (++d->items > d->max_items) return limit_error(d, pos, " further");
    Py_ssize_t start = pos;
    unsigned ib = data[pos++], major = ib >> 5, info = ib & 0x1F;
    uint64_t arg = info;
    int indefinite = 0;
    if (info >= 24 && info < 28) {
        int size = 1 << (info - 24);
        if (size > end - pos) return v1_short(d, pos, (unsigned)size, "argument");
        arg = read_be(data + pos, size);
        pos += size;
    } else if (info == 31 && major != 0 && major != 1 && major != 6) {
        indefinite = 1;
    } else if (info >= 24) {
        return fail(d, "malformed",
                    PyUnicode_FromFormat("reserved additional information %u in major type %u",
                                         info, major),
                    start);
    }
    switch (major) {
    case 0:
        *next = pos;
        return PyLong_FromUnsignedLongLong(arg);
    case 1:
        *next = pos;
        return negative(arg);
    case 2:
    case 3:
        if (indefinite) return v1_indefinite_string(d, (int)major, pos, next);
        if (arg > (uint64_t)(end - pos)) return v1_short(d, pos, arg, "string");
        *next = pos + (Py_ssize_t)arg;
        if (major == 2) return PyBytes_FromStringAndSize((const char *)data + pos, (Py_ssize_t)arg);
        return text(d, pos, (Py_ssize_t)arg);
    case 4: {
        if (depth >= d->max_depth)
            return fail(d, "depth",
                        PyUnicode_FromFormat("CBOR nesting deeper than %d levels", d->max_depth),
                        start);
        if (indefinite) {
            PyObject *out = PyList_New(0);
            if (out == NULL) return NULL;
            for (;;) {
                if (pos >= end) {
                    Py_DECREF(out);
                    return v1_short(d, pos, 1, "array item or break");
                }
                if (data[pos] == 0xFF) {
                    *next = pos + 1;
                    return out;
                }
                PyObject *item = v1_value(d, pos, depth + 1, &pos);
                if (item == NULL || PyList_Append(out, item) < 0) {
                    Py_XDECREF(item);
                    Py_DECREF(out);
                    return NULL;
                }
                Py_DECREF(item);
            }
        }
        if (arg > (uint64_t)(end - pos)) {
            char what[64];
            snprintf(what, sizeof what, "array of %llu items", (unsigned long long)arg);
            return v1_short(d, pos, arg, what);
        }
        Py_ssize_t n = (Py_ssize_t)arg;
        int grow = n > PREALLOC_MAX;
        PyObject *out = PyList_New(grow ? 0 : n);
        if (out == NULL) return NULL;
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *item = v1_value(d, pos, depth + 1, &pos);
            if (item == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            if (!grow) {
                PyList_SET_ITEM(out, i, item);
            } else {
                int rc = PyList_Append(out, item);
                Py_DECREF(item);
                if (rc < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
            }
        }
        *next = pos;
        return out;
    }
    case 5: {
        if (depth >= d->max_depth)
            return fail(d, "depth",
                        PyUnicode_FromFormat("CBOR nesting deeper than %d levels", d->max_depth),
                        start);
        PyObject *out = PyDict_New();
        if (out == NULL) return NULL;
        if (indefinite) {
            for (;;) {
                if (pos >= end) {
                    Py_DECREF(out);
                    return v1_short(d, pos, 1, "map key or break");
                }
                if (data[pos] == 0xFF) {
                    *next = pos + 1;
                    return out;
                }
                pos = v1_entry(d, out, pos, depth);
                if (pos < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
            }
        }
        /* Every entry takes at least two bytes: a count beyond the bytes left is a lie. */
        if (arg > (uint64_t)((end - pos) / 2)) {
            char what[64];
            snprintf(what, sizeof what, "map of %llu entries", (unsigned long long)arg);
            Py_DECREF(out);
            return v1_short(d, pos, (unsigned __int128)arg * 2, what);
        }
        for (uint64_t i = 0; i < arg; i++) {
            pos = v1_entry(d, out, pos, depth);
            if (pos < 0) {
                Py_DECREF(out);
                return NULL;
            }
        }
        *next = pos;
        return out;
    }
    case 6:
        return fail(d, "tag",
                    PyUnicode_FromFormat("CBOR tag %llu is not allowed in a manifest",
                                         (unsigned long long)arg),
                    start);
    default: /* 7: simple values and floats */
        *next = pos;
        switch (info) {
        case 20:
            Py_RETURN_FALSE;
        case 21:
            Py_RETURN_TRUE;
        case 22:
            Py_RETURN_NONE;
        case 25:
            return float_of(data + pos - 2, 2);
        case 26:
            return float_of(data + pos - 4, 4);
        case 27:
            return float_of(data + pos - 8, 8);
        case 31:
            return fail(d, "malformed", PyUnicode_FromString("unexpected CBOR break code"), start);
        default:
            return fail(d, "malformed",
                        PyUnicode_FromFormat("CBOR simple value %llu is not allowed in a manifest",
                                             (unsigned long long)arg),
                        start);
        }
    }
}

/* zTensor 2: deterministic CBOR ----------------------------------------------------------- */

/* The shortest of f16/f32/f64 that keeps `v` exactly, NaN only as f9 7e00 (cbor._float). */
static int shortest_float(double v, unsigned char out[9]) {
    if (v != v) {
        out[0] = 0xF9, out[1] = 0x7E, out[2] = 0x00;
        return 3;
    }
    if (PyFloat_Pack2(v, (char *)out + 1, 0) == 0) {
        if (PyFloat_Unpack2((const char *)out + 1, 0) == v) {
            out[0] = 0xF9;
            return 3;
        }
    } else {
        PyErr_Clear(); /* OverflowError: out of f16 range */
    }
    if (PyFloat_Pack4(v, (char *)out + 1, 0) == 0) {
        if (PyFloat_Unpack4((const char *)out + 1, 0) == v) {
            out[0] = 0xFA;
            return 5;
        }
    } else {
        PyErr_Clear();
    }
    out[0] = 0xFB;
    PyFloat_Pack8(v, (char *)out + 1, 0);
    return 9;
}

static PyObject *det_value(Dec *d, Py_ssize_t pos, int depth, Py_ssize_t *next) {
    const unsigned char *data = d->data;
    Py_ssize_t end = d->end;
    if (++d->items > d->max_items) return limit_error(d, pos, "");
    Py_ssize_t start = pos;
    if (pos >= end)
        return fail(d, "malformed",
                    PyUnicode_FromFormat("CBOR item head needs a byte at offset %zd", pos), pos);
    unsigned ib = data[pos], major = ib >> 5, info = ib & 0x1F;
    uint64_t arg = info;
    if (info < 24) {
        pos += 1;
    } else if (info > 27) {
        PyObject *message =
            info == 31
                ? PyUnicode_FromString("indefinite length is not deterministic CBOR")
                : PyUnicode_FromFormat(
                      "reserved additional information %u is not deterministic CBOR", info);
        return fail(d, "deterministic", message, pos);
    } else {
        int size = 1 << (info - 24);
        if (size > end - pos - 1)
            return fail(d, "malformed",
                        PyUnicode_FromFormat("CBOR argument needs %d bytes at offset %zd, only "
                                             "%zd left",
                                             size, pos + 1, end - pos - 1),
                        pos);
        arg = read_be(data + pos + 1, size);
        if (major != 7 && arg < (size == 1 ? 24u : (uint64_t)1 << (4 * size)))
            return fail(d, "deterministic",
                        PyUnicode_FromFormat("integer head at offset %zd is not in its shortest "
                                             "form",
                                             pos),
                        pos);
        pos += 1 + size;
    }
    switch (major) {
    case 0:
        *next = pos;
        return PyLong_FromUnsignedLongLong(arg);
    case 1:
        *next = pos;
        return negative(arg);
    case 2:
    case 3:
        if (arg > (uint64_t)(end - pos)) {
            PyObject *n = commas_u64(arg);
            if (n == NULL) return NULL;
            PyObject *message =
                PyUnicode_FromFormat("CBOR string of %U bytes at offset %zd runs past the end", n,
                                     start);
            Py_DECREF(n);
            return fail(d, "malformed", message, start);
        }
        *next = pos + (Py_ssize_t)arg;
        if (major == 2) return PyBytes_FromStringAndSize((const char *)data + pos, (Py_ssize_t)arg);
        return text(d, pos, (Py_ssize_t)arg);
    case 4:
    case 5: {
        if (depth >= d->max_depth)
            return fail(d, "depth",
                        PyUnicode_FromFormat("nesting deeper than %d levels from the manifest root",
                                             d->max_depth),
                        start);
        if (major == 4 ? arg > (uint64_t)(end - pos) : arg > (uint64_t)((end - pos) / 2)) {
            PyObject *n = commas_u64(arg);
            if (n == NULL) return NULL;
            PyObject *message =
                PyUnicode_FromFormat(major == 4 ? "array of %U items at offset %zd cannot fit"
                                                : "map of %U entries at offset %zd cannot fit",
                                     n, start);
            Py_DECREF(n);
            return fail(d, "malformed", message, start);
        }
        if (major == 4) {
            Py_ssize_t n = (Py_ssize_t)arg;
            int grow = n > PREALLOC_MAX;
            PyObject *out = PyList_New(grow ? 0 : n);
            if (out == NULL) return NULL;
            for (Py_ssize_t i = 0; i < n; i++) {
                PyObject *item = det_value(d, pos, depth + 1, &pos);
                if (item == NULL) {
                    Py_DECREF(out);
                    return NULL;
                }
                if (!grow) {
                    PyList_SET_ITEM(out, i, item);
                } else {
                    int rc = PyList_Append(out, item);
                    Py_DECREF(item);
                    if (rc < 0) {
                        Py_DECREF(out);
                        return NULL;
                    }
                }
            }
            *next = pos;
            return out;
        }
        PyObject *out = PyDict_New();
        if (out == NULL) return NULL;
        const unsigned char *prev = NULL;
        Py_ssize_t prev_len = 0;
        for (uint64_t i = 0; i < arg; i++) {
            Py_ssize_t key_at = pos;
            PyObject *key = det_value(d, pos, depth + 1, &pos);
            if (key == NULL) goto map_fail;
            if (!PyUnicode_CheckExact(key)) {
                fail(d, "key",
                     PyUnicode_FromFormat("map key is a %s: only text keys", Py_TYPE(key)->tp_name),
                     key_at);
                Py_DECREF(key);
                goto map_fail;
            }
            /* Keys ascend strictly in the order of their encoded bytes (a proper prefix first). */
            const unsigned char *encoded = data + key_at;
            Py_ssize_t len = pos - key_at;
            if (prev != NULL) {
                int c = memcmp(encoded, prev, (size_t)(len < prev_len ? len : prev_len));
                if (c < 0 || (c == 0 && len <= prev_len)) {
                    int same = c == 0 && len == prev_len;
                    fail(d, same ? "duplicate" : "order",
                         PyUnicode_FromFormat(same ? "duplicate map key %R"
                                                   : "map keys out of order at %R",
                                              key),
                         key_at);
                    Py_DECREF(key);
                    goto map_fail;
                }
            }
            prev = encoded;
            prev_len = len;
            PyObject *value = det_value(d, pos, depth + 1, &pos);
            if (value == NULL) {
                Py_DECREF(key);
                goto map_fail;
            }
            int rc = PyDict_SetItem(out, key, value);
            Py_DECREF(key);
            Py_DECREF(value);
            if (rc < 0) goto map_fail;
        }
        *next = pos;
        return out;
    map_fail:
        Py_DECREF(out);
        return NULL;
    }
    case 6:
        return fail(d, "tag",
                    PyUnicode_FromFormat("CBOR tag %llu is not allowed in a manifest",
                                         (unsigned long long)arg),
                    start);
    default: /* 7 */
        *next = pos;
        switch (info) {
        case 20:
            Py_RETURN_FALSE;
        case 21:
            Py_RETURN_TRUE;
        case 22:
            Py_RETURN_NONE;
        case 25:
        case 26:
        case 27: {
            int size = 1 << (info - 24);
            PyObject *value = float_of(data + start + 1, size);
            if (value == NULL) return NULL;
            unsigned char want[9];
            int n = shortest_float(PyFloat_AS_DOUBLE(value), want);
            if (n != 1 + size || memcmp(want, data + start, (size_t)n) != 0) {
                Py_DECREF(value);
                return fail(d, "deterministic",
                            PyUnicode_FromFormat("float at offset %zd is not in its shortest "
                                                 "exact form (or is a NaN other than f9 7e00)",
                                                 start),
                            start);
            }
            return value;
        }
        default:
            return fail(d, "simple",
                        PyUnicode_FromFormat("CBOR simple value %llu is not allowed in a manifest",
                                             (unsigned long long)arg),
                        start);
        }
    }
}

/* Module ---------------------------------------------------------------------------------- */

/* Shared by both entry points: arguments, the buffer, the trailing-bytes check. */
static PyObject *run(PyObject *args, const char *format, int deterministic) {
    Py_buffer view;
    PyObject *max_items, *error;
    int max_depth;
    Dec d;
    if (deterministic) {
        if (!PyArg_ParseTuple(args, format, &view, &max_depth, &max_items, &error)) return NULL;
    } else {
        if (!PyArg_ParseTuple(args, format, &view, &max_items, &max_depth, &error)) return NULL;
    }
    if (max_depth < 0 || max_depth > MAX_DEPTH_CEILING) {
        PyBuffer_Release(&view);
        return PyErr_Format(PyExc_ValueError, "max_depth must be 0 to %d", MAX_DEPTH_CEILING);
    }
    int overflow = 0;
    long long limit = PyLong_AsLongLongAndOverflow(max_items, &overflow);
    if (limit == -1 && PyErr_Occurred()) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (overflow) limit = overflow > 0 ? LLONG_MAX : LLONG_MIN;
    d.data = (const unsigned char *)view.buf;
    d.end = view.len;
    d.items = 0;
    d.max_items = limit;
    d.max_items_obj = max_items;
    d.max_depth = max_depth;
    d.error = error;
    memset(d.texts, 0, sizeof d.texts);
    Py_ssize_t pos = 0;
    PyObject *value = deterministic ? det_value(&d, 0, 0, &pos) : v1_value(&d, 0, 0, &pos);
    for (int i = 0; i < CACHE_SLOTS; i++) Py_XDECREF(d.texts[i]);
    if (value != NULL && pos != d.end) {
        Py_CLEAR(value);
        fail(&d, "trailing",
             PyUnicode_FromFormat(deterministic
                                      ? "%zd bytes follow the CBOR item inside its length"
                                      : "%zd bytes follow the CBOR item inside its declared size",
                                  d.end - pos),
             pos);
    }
    PyBuffer_Release(&view);
    return value;
}

static PyObject *py_loads(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, "y*OiO:loads", 0);
}

static PyObject *py_loads_deterministic(PyObject *self, PyObject *args) {
    (void)self;
    return run(args, "y*iOO:loads_deterministic", 1);
}

static PyMethodDef methods[] = {
    {"loads", py_loads, METH_VARARGS,
     "loads(data, max_items, max_depth, error): one zTensor v1 CBOR item filling data."},
    {"loads_deterministic", py_loads_deterministic, METH_VARARGS,
     "loads_deterministic(data, max_depth, max_items, error): one deterministic CBOR item."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_cbor_kernel", "Strict CBOR decoders of the zTensor manifests.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__cbor_kernel(void) { return PyModule_Create(&module); }
