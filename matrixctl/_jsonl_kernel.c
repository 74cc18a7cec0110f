/* The JSON Lines text-field extractor of `ingest docs` (docs/inputs.md, "JSON Lines records
 * are scanned in C"; matrixctl/ingest/extract.py, `jsonl_texts`).
 *
 * texts(data, start, end, field, limit, out) -> rows: bytes
 *
 * `data[start:end]` holds whole lines (a work unit's bytes). Each line is scanned once, with
 * no Python object made for it: when it is a JSON object whose top-level member `field` (the
 * key's UTF-8 bytes, compared as they are) is a string, the string's value is written to `out`
 * unescaped, as UTF-8, with every CR that comes right before an LF dropped (what
 * `text.replace("\r\n", "\n")` gives); `out` is a writable buffer at least 16 bytes longer
 * than the bytes scanned (a text is never longer than its JSON), reused by the caller from
 * call to call. `rows` holds five native int64 per line, in order:
 * (start, stop, text offset in out, text length, kind), `stop` after the line's LF (or at
 * `end`), kind 1 for an ASCII text, 2 for a text with other characters, 0 for a line left to
 * the caller (offset and length 0).
 *
 * The rule that makes it safe: a line is taken only when orjson takes it with exactly that
 * text (it parses the line the same way in `jsonl_texts`: a JSON object, every byte checked).
 * Anything else is left to the caller, whose orjson and standard-library path gives today's
 * text, skip, count or error: any syntax error; a top-level value that is not an object; the
 * field missing, not a string, or given twice (last-wins is the caller's); a top-level key
 * with an escape (it could spell the field); an escape giving a lone surrogate; a number
 * with more than 40 digits before or after its point or an exponent beyond 200 (orjson
 * refuses a number that is infinite as a double, and the bound keeps every taken number far
 * from that); nesting deeper than MAX_DEPTH; invalid UTF-8 (overlong forms, surrogates,
 * beyond U+10FFFF); a control character in a string; a blank or white-space-only line; a
 * byte order mark; a line longer than `limit` bytes without its LF (the caller's error).
 * White space is JSON's four characters; an LF only ends the line.
 *
 * The GIL is released while the lines are scanned; `data` stays exported (a bytearray cannot
 * be resized under it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#define MAX_DEPTH 64       /* containers inside the top-level object (orjson goes to 1,024) */
#define MAX_DIGITS 40      /* digits before and after a number's point */
#define MAX_EXPONENT 200   /* 10^(40 + 200) is far below the largest double */
#define ROW_WORDS 5

enum { ROW_CALLER = 0, ROW_ASCII = 1, ROW_UTF8 = 2 };

typedef struct {
    const uint8_t *end; /* the end of the bytes to scan */
    uint8_t *w;         /* the output cursor */
    uint8_t *w0;        /* where the value being written starts */
    int high;           /* the value has a byte >= 0x80 */
    int escaped;        /* the last string scanned had an escape */
} Scan;

static inline const uint8_t *skip_ws(const uint8_t *p, const uint8_t *end) {
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r')) p++;
    return p;
}

/* The value of a hex digit, -1 for any other byte. */
static const int8_t HEX[256] = {
    ['0'] = 0 + 1, ['1'] = 1 + 1, ['2'] = 2 + 1, ['3'] = 3 + 1, ['4'] = 4 + 1, ['5'] = 5 + 1,
    ['6'] = 6 + 1, ['7'] = 7 + 1, ['8'] = 8 + 1, ['9'] = 9 + 1, ['a'] = 10 + 1, ['b'] = 11 + 1,
    ['c'] = 12 + 1, ['d'] = 13 + 1, ['e'] = 14 + 1, ['f'] = 15 + 1, ['A'] = 10 + 1,
    ['B'] = 11 + 1, ['C'] = 12 + 1, ['D'] = 13 + 1, ['E'] = 14 + 1, ['F'] = 15 + 1,
}; /* stored plus one, so that the zero of every other entry means "not a digit" */

static inline int hex4(const uint8_t *p, uint32_t *out) {
    int a = HEX[p[0]] - 1, b = HEX[p[1]] - 1, c = HEX[p[2]] - 1, d = HEX[p[3]] - 1;
    if ((a | b | c | d) < 0) return 0;
    *out = (uint32_t)(a << 12 | b << 8 | c << 4 | d);
    return 1;
}

/* What each one-character escape stands for (\uXXXX apart), 0 for an invalid escape. */
static const uint8_t ESCAPE[256] = {
    ['"'] = '"', ['\\'] = '\\', ['/'] = '/', ['b'] = '\b', ['f'] = '\f', ['n'] = '\n',
    ['r'] = '\r', ['t'] = '\t',
};

/* The length of the well-formed UTF-8 sequence at p (p[0] >= 0x80), 0 when it is not one. */
static inline int utf8_len(const uint8_t *p, const uint8_t *end) {
    uint8_t c = p[0];
    ptrdiff_t room = end - p;
    if (c >= 0xC2 && c <= 0xDF) return room >= 2 && (p[1] & 0xC0) == 0x80 ? 2 : 0;
    if (c >= 0xE0 && c <= 0xEF) {
        if (room < 3 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80) return 0;
        if (c == 0xE0 && p[1] < 0xA0) return 0; /* overlong */
        if (c == 0xED && p[1] > 0x9F) return 0; /* a surrogate */
        return 3;
    }
    if (c >= 0xF0 && c <= 0xF4) {
        if (room < 4 || (p[1] & 0xC0) != 0x80 || (p[2] & 0xC0) != 0x80 || (p[3] & 0xC0) != 0x80)
            return 0;
        if (c == 0xF0 && p[1] < 0x90) return 0; /* overlong */
        if (c == 0xF4 && p[1] > 0x8F) return 0; /* beyond U+10FFFF */
        return 4;
    }
    return 0;
}

/* One character of the value; an LF right after a CR of the value replaces it. */
static inline uint8_t *put(Scan *s, uint8_t *w, uint32_t cp) {
    if (cp < 0x80) {
        if (cp == '\n' && w > s->w0 && w[-1] == '\r') w[-1] = '\n';
        else *w++ = (uint8_t)cp;
    } else if (cp < 0x800) {
        *w++ = (uint8_t)(0xC0 | cp >> 6);
        *w++ = (uint8_t)(0x80 | (cp & 0x3F));
        s->high = 1;
    } else if (cp < 0x10000) {
        *w++ = (uint8_t)(0xE0 | cp >> 12);
        *w++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        *w++ = (uint8_t)(0x80 | (cp & 0x3F));
        s->high = 1;
    } else {
        *w++ = (uint8_t)(0xF0 | cp >> 18);
        *w++ = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
        *w++ = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
        *w++ = (uint8_t)(0x80 | (cp & 0x3F));
        s->high = 1;
    }
    return w;
}

/* A string from just after its opening quote to just after its closing one; its value is
 * written at s->w when `out`. 0, or -1 for a string to leave to the caller. The output never
 * runs ahead of the input (an escape is longer than what it gives), so 16-byte stores into an
 * output as long as the input stay inside it. */
static int scan_string(Scan *s, const uint8_t **pp, int out) {
    const uint8_t *p = *pp, *end = s->end;
    uint8_t *w = s->w;
    s->escaped = 0;
    for (;;) {
#if defined(__SSE2__)
        if (end - p >= 16) {
            const __m128i v = _mm_loadu_si128((const __m128i *)p);
            /* signed: < 0x20 is a control character or a byte >= 0x80 */
            const __m128i m = _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, _mm_set1_epi8('"')),
                             _mm_cmpeq_epi8(v, _mm_set1_epi8('\\'))),
                _mm_cmplt_epi8(v, _mm_set1_epi8(0x20)));
            unsigned mask = (unsigned)_mm_movemask_epi8(m);
            if (out) _mm_storeu_si128((__m128i *)w, v);
            if (mask == 0) {
                p += 16;
                w += 16;
                continue;
            }
            unsigned k = (unsigned)__builtin_ctz(mask);
            p += k;
            w += k;
        } else
#endif
        {
            while (p < end && *p >= 0x20 && *p < 0x80 && *p != '"' && *p != '\\') {
                if (out) *w = *p;
                w++;
                p++;
            }
            if (p >= end) return -1; /* the string does not end in these bytes */
        }
        uint8_t c = *p;
        if (c == '"') {
            *pp = p + 1;
            if (out) s->w = w;
            return 0;
        }
        if (c == '\\') {
            s->escaped = 1;
            if (end - p < 2) return -1;
            uint8_t e = ESCAPE[p[1]];
            if (e) {
                p += 2;
                if (!out) continue;
                if (e == '\n' && w > s->w0 && w[-1] == '\r') w[-1] = '\n';
                else *w++ = e;
                continue;
            }
            uint32_t cp;
            if (p[1] != 'u' || end - p < 6 || !hex4(p + 2, &cp)) return -1;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return -1; /* a lone low surrogate */
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                uint32_t lo;
                if (end - p < 12 || p[6] != '\\' || p[7] != 'u' || !hex4(p + 8, &lo) ||
                    lo < 0xDC00 || lo > 0xDFFF)
                    return -1; /* a lone high surrogate */
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                p += 6;
            }
            p += 6;
            if (out) w = put(s, w, cp);
            continue;
        }
        if (c < 0x20) return -1;
        int n = utf8_len(p, end); /* a byte >= 0x80 */
        if (!n) return -1;
        if (out) {
            memcpy(w, p, (size_t)n);
            s->high = 1;
        }
        w += n;
        p += n;
    }
}

static int scan_number(const uint8_t **pp, const uint8_t *end) {
    const uint8_t *p = *pp, *q;
    if (p < end && *p == '-') p++;
    if (p >= end) return -1;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        q = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p - q > MAX_DIGITS) return -1;
    } else {
        return -1;
    }
    if (p < end && *p == '.') {
        q = ++p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == q || p - q > MAX_DIGITS) return -1;
    }
    if (p < end && (*p | 0x20) == 'e') {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        q = p;
        int e = 0;
        while (p < end && *p >= '0' && *p <= '9') {
            if (p - q >= 3) return -1;
            e = e * 10 + (*p - '0');
            p++;
        }
        if (p == q || e > MAX_EXPONENT) return -1;
    }
    if (p < end && *p >= '0' && *p <= '9') return -1; /* a leading zero */
    *pp = p;
    return 0;
}

static inline int literal(const uint8_t **pp, const uint8_t *end, const char *word, int n) {
    if (end - *pp < n || memcmp(*pp, word, (size_t)n) != 0) return -1;
    *pp += n;
    return 0;
}

/* Any value (checked, nothing written), containers iteratively up to MAX_DEPTH. */
static int scan_value(Scan *s, const uint8_t **pp) {
    const uint8_t *p = *pp, *end = s->end;
    uint8_t closers[MAX_DEPTH];
    int depth = 0;
value:
    if (p >= end) return -1;
    switch (*p) {
    case '"':
        p++;
        if (scan_string(s, &p, 0)) return -1;
        break;
    case '{':
    case '[':
        if (depth == MAX_DEPTH) return -1;
        closers[depth++] = *p == '{' ? '}' : ']';
        p = skip_ws(p + 1, end);
        if (p < end && *p == closers[depth - 1]) {
            p++;
            depth--;
            break;
        }
        if (closers[depth - 1] == '}') goto key;
        goto value;
    case 't':
        if (literal(&p, end, "true", 4)) return -1;
        break;
    case 'f':
        if (literal(&p, end, "false", 5)) return -1;
        break;
    case 'n':
        if (literal(&p, end, "null", 4)) return -1;
        break;
    default:
        if (scan_number(&p, end)) return -1;
        break;
    }
after: /* a value ended */
    if (depth == 0) {
        *pp = p;
        return 0;
    }
    p = skip_ws(p, end);
    if (p >= end) return -1;
    if (*p == ',') {
        p = skip_ws(p + 1, end);
        if (closers[depth - 1] == '}') goto key;
        goto value;
    }
    if (*p == closers[depth - 1]) {
        p++;
        depth--;
        goto after;
    }
    return -1;
key:
    if (p >= end || *p != '"') return -1;
    p++;
    if (scan_string(s, &p, 0)) return -1;
    p = skip_ws(p, end);
    if (p >= end || *p != ':') return -1;
    p = skip_ws(p + 1, end);
    goto value;
}

/* One line from p: 0 with the text written at s->w0..s->w and *pp after the line's JSON
 * (at its LF or the end), or -1 for a line to leave to the caller. */
static int scan_line(Scan *s, const uint8_t **pp, const uint8_t *field, Py_ssize_t flen) {
    const uint8_t *p = skip_ws(*pp, s->end), *end = s->end;
    int found = 0;
    if (p >= end || *p != '{') return -1;
    p = skip_ws(p + 1, end);
    for (;;) {
        if (p >= end || *p != '"') return -1; /* also an empty object: no field */
        const uint8_t *k = ++p;
        if (scan_string(s, &p, 0) || s->escaped) return -1;
        int match = (p - 1 - k) == flen && memcmp(k, field, (size_t)flen) == 0;
        p = skip_ws(p, end);
        if (p >= end || *p != ':') return -1;
        p = skip_ws(p + 1, end);
        if (match) {
            if (found || p >= end || *p != '"') return -1;
            found = 1;
            p++;
            s->w = s->w0;
            s->high = 0;
            if (scan_string(s, &p, 1)) return -1;
        } else if (scan_value(s, &p)) {
            return -1;
        }
        p = skip_ws(p, end);
        if (p >= end) return -1;
        if (*p == '}') break;
        if (*p != ',') return -1;
        p = skip_ws(p + 1, end);
    }
    p = skip_ws(p + 1, end);
    if (!found || (p < end && *p != '\n')) return -1;
    *pp = p;
    return 0;
}

static PyObject *texts(PyObject *Py_UNUSED(module), PyObject *args) {
    Py_buffer buf, fbuf, obuf;
    Py_ssize_t start, end, limit;
    if (!PyArg_ParseTuple(args, "y*nny*nw*", &buf, &start, &end, &fbuf, &limit, &obuf))
        return NULL;
    PyObject *rows_obj = NULL;
    size_t cap = 1024, n = 0;
    int64_t *rows = NULL;
    int nomem = 0;
    if (start < 0 || end > buf.len || start > end) {
        PyErr_SetString(PyExc_ValueError, "start and end must lie inside the buffer");
        goto done;
    }
    if (obuf.len < end - start + 16) {
        PyErr_SetString(PyExc_ValueError, "out must be 16 bytes longer than the bytes to scan");
        goto done;
    }
    rows = PyMem_RawMalloc(cap * ROW_WORDS * sizeof(int64_t));
    if (!rows) {
        PyErr_NoMemory();
        goto done;
    }
    uint8_t *obase = (uint8_t *)obuf.buf;
    const uint8_t *base = (const uint8_t *)buf.buf, *stop_all = base + end;
    const uint8_t *field = (const uint8_t *)fbuf.buf;
    Py_BEGIN_ALLOW_THREADS
    Scan s = {stop_all, obase, obase, 0, 0};
    const uint8_t *line = base + start;
    while (line < stop_all) {
        const uint8_t *p = line, *stop;
        int64_t off = 0, len = 0, kind = ROW_CALLER;
        s.w0 = s.w;
        if (scan_line(&s, &p, field, fbuf.len) == 0) {
            stop = p < stop_all ? p + 1 : p;
            if (p - line <= limit) { /* the line's bytes without its LF */
                off = s.w0 - obase;
                len = s.w - s.w0;
                kind = s.high ? ROW_UTF8 : ROW_ASCII;
            }
        } else {
            const uint8_t *nl = memchr(line, '\n', (size_t)(stop_all - line));
            stop = nl ? nl + 1 : stop_all;
        }
        if (kind == ROW_CALLER) s.w = s.w0;
        if (n == cap) {
            int64_t *grown = PyMem_RawRealloc(rows, cap * 2 * ROW_WORDS * sizeof(int64_t));
            if (!grown) {
                nomem = 1;
                break;
            }
            rows = grown;
            cap *= 2;
        }
        int64_t *r = rows + n * ROW_WORDS;
        r[0] = line - base;
        r[1] = stop - base;
        r[2] = off;
        r[3] = len;
        r[4] = kind;
        n++;
        line = stop;
    }
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        goto done;
    }
    rows_obj = PyBytes_FromStringAndSize((const char *)rows,
                                         (Py_ssize_t)(n * ROW_WORDS * sizeof(int64_t)));
done:
    PyBuffer_Release(&buf);
    PyBuffer_Release(&fbuf);
    PyBuffer_Release(&obuf);
    PyMem_RawFree(rows);
    return rows_obj;
}

/* ---- normalization of UTF-8 text ---------------------------------------------------------
 *
 * normalize_utf8(data, gap, normalize) -> data itself, or bytes
 *
 * What `Tokenizer.prepare` makes of the text `data` (valid UTF-8) for a map whose space
 * marking leaves text as it is: `pi.normalize(text, form).encode()`, where `pi.normalize` is
 * `_pi_kernel.normalize_runs(text, gap, normalize)`: only the segments `_pi_kernel.segments`
 * names are normalized, each run of non-ASCII characters with the character before it,
 * segments closer than `gap` characters merged. The same segments are found here on the
 * bytes: a run of non-ASCII characters is a run of bytes >= 0x80, and what lies between two
 * runs is ASCII, one byte per character, so distances between runs are the same in bytes and
 * in characters. Each segment is decoded and given to `normalize`; a segment that comes back
 * as the same object (already normalized) stays as it is, and `data` itself is returned when
 * none changed: no string of the whole text, no re-encoding (tests compare it with
 * pi.normalize for every form). */

static Py_ssize_t next_high(const uint8_t *d, Py_ssize_t i, Py_ssize_t n) {
#if defined(__SSE2__)
    while (n - i >= 16) {
        unsigned mask = (unsigned)_mm_movemask_epi8(_mm_loadu_si128((const __m128i *)(d + i)));
        if (mask) return i + __builtin_ctz(mask);
        i += 16;
    }
#endif
    while (i < n && d[i] < 0x80) i++;
    return i;
}

typedef struct {
    char *p;
    size_t len, cap; /* cap starts as the text's length and a little more */
} Out;

static int out_add(Out *o, const void *src, size_t n) {
    if (o->len + n > o->cap || !o->p) {
        size_t cap = o->cap;
        while (cap < o->len + n) cap *= 2;
        char *grown = PyMem_Realloc(o->p, cap);
        if (!grown) {
            PyErr_NoMemory();
            return -1;
        }
        o->p = grown;
        o->cap = cap;
    }
    memcpy(o->p + o->len, src, n);
    o->len += n;
    return 0;
}

/* Segment [a, b) of d: normalized into o (with the plain bytes since *last before it) when
 * `normalize` changes it. */
static int segment(const uint8_t *d, Py_ssize_t a, Py_ssize_t b, PyObject *func, Out *o,
                   Py_ssize_t *last) {
    PyObject *seg = PyUnicode_DecodeUTF8((const char *)d + a, b - a, "strict");
    if (!seg) return -1;
    PyObject *normed = PyObject_CallOneArg(func, seg);
    int rc = 0;
    if (!normed) {
        rc = -1;
    } else if (normed != seg) {
        Py_ssize_t size;
        const char *u = PyUnicode_AsUTF8AndSize(normed, &size);
        if (!u || out_add(o, d + *last, (size_t)(a - *last)) < 0 || out_add(o, u, (size_t)size) < 0)
            rc = -1;
        *last = b;
    }
    Py_XDECREF(normed);
    Py_DECREF(seg);
    return rc;
}

static PyObject *normalize_utf8(PyObject *Py_UNUSED(module), PyObject *args) {
    PyObject *obj, *func, *result = NULL;
    Py_ssize_t gap;
    Py_buffer buf;
    if (!PyArg_ParseTuple(args, "OnO", &obj, &gap, &func)) return NULL;
    if (PyObject_GetBuffer(obj, &buf, PyBUF_SIMPLE) < 0) return NULL;
    const uint8_t *d = (const uint8_t *)buf.buf;
    Py_ssize_t n = buf.len, i = next_high(d, 0, n), a = -1, b = -1, last = 0;
    Out o = {NULL, 0, (size_t)n + (size_t)n / 16 + 64};
    while (i < n) {
        Py_ssize_t s = i;
        while (i < n && d[i] >= 0x80) i++;
        Py_ssize_t start = s > 0 ? s - 1 : 0;
        if (a >= 0 && start - b < gap) {
            b = i;
        } else {
            if (a >= 0 && segment(d, a, b, func, &o, &last) < 0) goto done;
            a = start;
            b = i;
        }
        i = next_high(d, i, n);
    }
    if (a >= 0 && segment(d, a, b, func, &o, &last) < 0) goto done;
    if (last == 0) {
        Py_INCREF(obj);
        result = obj;
    } else if (out_add(&o, d + last, (size_t)(n - last)) == 0) {
        result = PyBytes_FromStringAndSize(o.p, (Py_ssize_t)o.len);
    }
done:
    PyMem_Free(o.p);
    PyBuffer_Release(&buf);
    return result;
}

static PyMethodDef module_methods[] = {
    {"texts", texts, METH_VARARGS,
     "texts(data, start, end, field, limit, out) -> rows: the text field of each JSON Lines "
     "line of data[start:end] that orjson takes with that text, unescaped to UTF-8 in out; "
     "rows: (start, stop, offset, length, kind) per line as native int64, kind 0 for a line "
     "left to the caller, 1 ASCII, 2 other UTF-8."},
    {"normalize_utf8", normalize_utf8, METH_VARARGS,
     "normalize_utf8(data, gap, normalize) -> data, or bytes: pi.normalize of the UTF-8 text "
     "data, encoded; data itself when normalization changes nothing."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "matrixctl._jsonl_kernel",
    "The JSON Lines text-field extractor of ingest docs.", -1, module_methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__jsonl_kernel(void) { return PyModule_Create(&module); }
