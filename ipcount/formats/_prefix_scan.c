/*
 * ipcount.formats._prefix_scan: which of a chunk's lines are of the access-log grammar, and the
 * client and $time_local texts of those, each distinct text once.
 *
 * ChunkParser takes the two fields by position from the prefix of every line the grammar matched
 * (the client up to the first space, $time_local the TIME_TEXT_LENGTH bytes ending 2 before the
 * first '"') and decides each *distinct* text once, in Python. Done with Arrow that is two
 * substring searches, two gathers of the slices and two dictionary encodings per chunk: ~0.9 us
 * of a line's CPU. This module does the same in one pass over the lines' bytes: the same
 * positions, and each text's index into the list of the chunk's distinct texts (in order of first
 * appearance). What a text means (an IP, a real second) is still decided by accesslog's
 * functions alone; this module only cuts and groups bytes.
 *
 * scan(data, offsets, first, count, matched, longest_ip, time_length) ->
 *     (ip_index, ip_texts, time_index, time_texts)
 * data: the array's value bytes; offsets: its int32 offsets buffer; first/count: the array's
 * offset into them and its length; matched: one byte per line (non-zero: the grammar matched).
 * ip_index / time_index: bytes holding one int32 per line (-1 where not matched); a client text
 * longer than longest_ip bytes is the empty text (no IP is that long).
 *
 * lines(data, offsets, first, count, valid) -> bytes: which lines are of the grammar at all, the
 * verdict RE2 gives LINE_PATTERN_RE2, in one walk per line (see access_line).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *ptr;
    Py_ssize_t len;
    int32_t index;
} slot_t;

typedef struct {
    slot_t *slots; /* open addressing; ptr NULL: empty */
    size_t mask;
    int32_t count;
    PyObject *texts; /* list of str, by index */
} table_t;

static uint64_t hash_bytes(const char *p, Py_ssize_t n) {
    uint64_t h = 1469598103934665603ULL; /* FNV-1a */
    for (Py_ssize_t i = 0; i < n; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h ^ (h >> 29);
}

static int table_init(table_t *t, size_t capacity) {
    size_t n = 64;
    while (n < capacity * 2)
        n *= 2;
    t->slots = calloc(n, sizeof(slot_t));
    t->mask = n - 1;
    t->count = 0;
    t->texts = PyList_New(0);
    return (t->slots && t->texts) ? 0 : -1;
}

static void table_free(table_t *t) {
    free(t->slots);
    t->slots = NULL;
    Py_CLEAR(t->texts);
}

static int table_grow(table_t *t) {
    size_t n = (t->mask + 1) * 2;
    slot_t *slots = calloc(n, sizeof(slot_t));
    if (!slots)
        return -1;
    for (size_t i = 0; i <= t->mask; i++) {
        slot_t *s = &t->slots[i];
        if (!s->ptr)
            continue;
        size_t j = hash_bytes(s->ptr, s->len) & (n - 1);
        while (slots[j].ptr)
            j = (j + 1) & (n - 1);
        slots[j] = *s;
    }
    free(t->slots);
    t->slots = slots;
    t->mask = n - 1;
    return 0;
}

/* The index of text [p, p+n) in `t`, added when new; -1 with an exception set on failure. An
 * empty text has a non-NULL pointer of its own so that its slot is not taken for empty. */
static int32_t table_index(table_t *t, const char *p, Py_ssize_t n) {
    static const char empty[1] = "";
    if (n == 0)
        p = empty;
    size_t j = hash_bytes(p, n) & t->mask;
    for (;;) {
        slot_t *s = &t->slots[j];
        if (!s->ptr)
            break;
        if (s->len == n && memcmp(s->ptr, p, (size_t)n) == 0)
            return s->index;
        j = (j + 1) & t->mask;
    }
    /* Cut at ASCII bytes of a valid UTF-8 line (space, '"'), so each text is valid UTF-8. */
    PyObject *text = PyUnicode_DecodeUTF8(p, n, "strict");
    if (!text || PyList_Append(t->texts, text) < 0) {
        Py_XDECREF(text);
        return -1;
    }
    Py_DECREF(text);
    int32_t index = t->count++;
    t->slots[j] = (slot_t){p, n, index};
    if ((size_t)t->count * 2 > t->mask && table_grow(t) < 0) {
        PyErr_NoMemory();
        return -1;
    }
    return index;
}

/* The offsets of lines [first, first + count) of an Arrow string array's buffers, checked against
 * the data they index and against `per_line` (one byte per line); NULL with ValueError set. */
static const int32_t *line_offsets(const Py_buffer *data, const Py_buffer *offsets,
                                   Py_ssize_t first, Py_ssize_t count, const Py_buffer *per_line) {
    if (first < 0 || count < 0 || (first + count + 1) * 4 > offsets->len ||
        per_line->len < count) {
        PyErr_SetString(PyExc_ValueError, "offsets or per-line bytes too short for first + count");
        return NULL;
    }
    const int32_t *offs = (const int32_t *)offsets->buf + first;
    if (offs[count] > data->len || offs[0] < 0) {
        PyErr_SetString(PyExc_ValueError, "offsets beyond the data buffer");
        return NULL;
    }
    return offs;
}

static PyObject *scan(PyObject *self, PyObject *args) {
    Py_buffer data, offsets, matched;
    Py_ssize_t first, count, longest_ip, time_length;
    if (!PyArg_ParseTuple(args, "y*y*nny*nn", &data, &offsets, &first, &count, &matched,
                          &longest_ip, &time_length))
        return NULL;
    PyObject *result = NULL, *ip_index = NULL, *time_index = NULL;
    table_t ips = {0}, times = {0};
    const int32_t *offs = line_offsets(&data, &offsets, first, count, &matched);
    if (!offs)
        goto done;
    const char *bytes = (const char *)data.buf;
    const unsigned char *ok = (const unsigned char *)matched.buf;
    ip_index = PyBytes_FromStringAndSize(NULL, count * 4);
    time_index = PyBytes_FromStringAndSize(NULL, count * 4);
    if (!ip_index || !time_index || table_init(&ips, 4096) < 0 || table_init(&times, 256) < 0) {
        if (!PyErr_Occurred())
            PyErr_NoMemory();
        goto done;
    }
    int32_t *ip_out = (int32_t *)PyBytes_AS_STRING(ip_index);
    int32_t *time_out = (int32_t *)PyBytes_AS_STRING(time_index);
    for (Py_ssize_t i = 0; i < count; i++) {
        ip_out[i] = time_out[i] = -1;
        if (!ok[i])
            continue;
        const char *line = bytes + offs[i];
        Py_ssize_t len = offs[i + 1] - offs[i];
        if (len < 0) {
            PyErr_SetString(PyExc_ValueError, "offsets decrease");
            goto done;
        }
        /* A matched line has both (the grammar); absent, the texts are empty (no IP, no time). */
        const char *space = memchr(line, ' ', (size_t)len);
        const char *quote = memchr(line, '"', (size_t)len);
        Py_ssize_t ip_len = space ? space - line : 0;
        if (ip_len > longest_ip)
            ip_len = 0;
        const char *time_at = line;
        Py_ssize_t time_len = 0;
        if (quote && quote - line >= 2 + time_length) {
            time_at = quote - 2 - time_length;
            time_len = time_length;
        }
        if ((ip_out[i] = table_index(&ips, line, ip_len)) < 0 ||
            (time_out[i] = table_index(&times, time_at, time_len)) < 0)
            goto done;
    }
    result = Py_BuildValue("OOOO", ip_index, ips.texts, time_index, times.texts);
done:
    Py_XDECREF(ip_index);
    Py_XDECREF(time_index);
    table_free(&ips);
    table_free(&times);
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&matched);
    return result;
}

/* The field characters of the prefix (accesslog._FIELD): neither ASCII whitespace nor '"'. */
static int field_char(unsigned char c) {
    return !(c == ' ' || c == '"' || c == '\t' || c == '\n' || c == '\v' || c == '\f' ||
             c == '\r');
}

static int ascii_digit(unsigned char c) { return c >= '0' && c <= '9'; }

/* One field [p, p+n) of the prefix (a run of field characters) and the single space after it:
 * the index past that space, or -1. A run of field characters ends only where the next byte is
 * not one, so it is taken whole. */
static Py_ssize_t field_then_space(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    Py_ssize_t i = at;
    while (i < n && field_char(p[i]))
        i++;
    return (i > at && i < n && p[i] == ' ') ? i + 1 : -1;
}

/* accesslog.TIME_PATTERN over exactly 26 bytes: 22/Nov/2026:09:57:08 +0000. */
static int time_text(const unsigned char *t) {
    static const char shape[] = "dd/Ull/Nddd:dd:dd:dd Sdddd";
    for (int i = 0; i < 26; i++) {
        unsigned char c = t[i];
        switch (shape[i]) {
        case 'd': if (!ascii_digit(c)) return 0; break;
        case 'N': if (c < '1' || c > '9') return 0; break;
        case 'U': if (c < 'A' || c > 'Z') return 0; break;
        case 'l': if (c < 'a' || c > 'z') return 0; break;
        case 'S': if (c != '+' && c != '-') return 0; break;
        default: if (c != (unsigned char)shape[i]) return 0;
        }
    }
    return 1;
}

/* A quoted field's body from `at` (just past its opening '"'): runs of bytes that are neither '"'
 * nor '\\', each '\\' escaping the one byte after it; the index past the closing '"', or -1.
 * Byte by byte is the same language as RE2's code points here: every byte the grammar names is
 * ASCII, and ASCII bytes never occur inside a UTF-8 sequence. */
static Py_ssize_t quoted_body(const unsigned char *p, Py_ssize_t at, Py_ssize_t n) {
    /* memchr (vectorised) to the next '"': it closes the field unless an escape takes it. The
     * escapes before it are skipped one memchr each, and that '"' is searched for again only
     * when an escape took it, so every byte is looked at about twice, however many escapes a
     * field holds (nginx writes each byte >= 0x7F as one: a 500 KB field can hold 125,000). */
    Py_ssize_t i = at;
    const unsigned char *quote = memchr(p + i, '"', (size_t)(n - i));
    while (quote) {
        Py_ssize_t q = quote - p;
        const unsigned char *escape = memchr(p + i, '\\', (size_t)(q - i));
        if (!escape)
            return q + 1;
        i = escape - p + 2; /* past the escape and the byte it escapes (a '"' or any other) */
        if (i > q) /* it escaped this '"' (i = q + 1 <= n): the next one may close the field */
            quote = memchr(p + i, '"', (size_t)(n - i));
    }
    return -1;
}

/* Whether the line is one of accesslog's grammar (LINE_PATTERN_RE2, a whole valid UTF-8 line):
 * a deterministic walk, since every part of it ends where the next byte says. */
static int access_line(const unsigned char *p, Py_ssize_t n) {
    Py_ssize_t i = field_then_space(p, 0, n); /* $remote_addr */
    if (i < 0 || (i = field_then_space(p, i, n)) < 0) /* the '-' before $remote_user */
        return 0;
    /* $remote_user runs (at least one byte, no '"') up to ' [' $time_local '] "', whose '"' is the
     * line's first: nothing before it may hold one. */
    const unsigned char *quote = memchr(p + i, '"', (size_t)(n - i));
    if (!quote)
        return 0;
    Py_ssize_t q = quote - p;
    if (q - i < 31 || p[q - 1] != ' ' || p[q - 2] != ']' || p[q - 29] != '[' || p[q - 30] != ' ' ||
        !time_text(p + q - 28))
        return 0;
    if ((i = quoted_body(p, q + 1, n)) < 0) /* $request */
        return 0;
    if (i + 5 > n || p[i] != ' ' || !ascii_digit(p[i + 1]) || !ascii_digit(p[i + 2]) ||
        !ascii_digit(p[i + 3]) || p[i + 4] != ' ')
        return 0; /* ' ' $status ' ' */
    i += 5;
    if (i < n && p[i] == '-') { /* $body_bytes_sent */
        i++;
    } else {
        Py_ssize_t d = i;
        while (i < n && ascii_digit(p[i]))
            i++;
        if (i == d)
            return 0;
    }
    for (int field = 0; field < 2; field++) { /* ' "' $http_referer '"', then the user agent */
        if (i + 2 > n || p[i] != ' ' || p[i + 1] != '"' || (i = quoted_body(p, i + 2, n)) < 0)
            return 0;
    }
    return i == n;
}

/* lines(data, offsets, first, count, valid) -> bytes: one byte per line, 1 where the line is one
 * of the grammar; `valid` holds one byte per line, zero for a null or invalid UTF-8 line (never
 * one). The same verdict as pyarrow's match_substring_regex with LINE_PATTERN_RE2, without RE2:
 * tests/unit/formats/test_parse_parity.py holds the two line for line. */
static PyObject *lines(PyObject *self, PyObject *args) {
    Py_buffer data, offsets, valid;
    Py_ssize_t first, count;
    if (!PyArg_ParseTuple(args, "y*y*nny*", &data, &offsets, &first, &count, &valid))
        return NULL;
    PyObject *result = NULL;
    const int32_t *offs = line_offsets(&data, &offsets, first, count, &valid);
    if (!offs)
        goto done;
    const unsigned char *bytes = (const unsigned char *)data.buf;
    const unsigned char *ok = (const unsigned char *)valid.buf;
    result = PyBytes_FromStringAndSize(NULL, count);
    if (!result)
        goto done;
    unsigned char *out = (unsigned char *)PyBytes_AS_STRING(result);
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_ssize_t len = offs[i + 1] - offs[i];
        if (len < 0) {
            Py_CLEAR(result);
            PyErr_SetString(PyExc_ValueError, "offsets decrease");
            goto done;
        }
        out[i] = ok[i] ? (unsigned char)access_line(bytes + offs[i], len) : 0;
    }
done:
    PyBuffer_Release(&data);
    PyBuffer_Release(&offsets);
    PyBuffer_Release(&valid);
    return result;
}

static PyMethodDef module_methods[] = {
    {"lines", lines, METH_VARARGS,
     "lines(data, offsets, first, count, valid) -> bytes: 1 per line of the access-log grammar"},
    {"scan", scan, METH_VARARGS,
     "scan(data, offsets, first, count, matched, longest_ip, time_length) -> "
     "(ip_index, ip_texts, time_index, time_texts)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_prefix_scan",
    "Which of a chunk's lines are access lines, and their client and $time_local texts", -1,
    module_methods,
};

PyMODINIT_FUNC PyInit__prefix_scan(void) { return PyModule_Create(&module); }
