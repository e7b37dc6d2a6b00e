/* The plain text delta's byte work in C: gateway/pipeline/_plain_delta.py's
 * ``plain_blocks`` (its rule 7), built by the compiled build only (hatch_build.py, with
 * NNRP_GATEWAY_COMPILE=1) as the module gateway.pipeline._plain_delta_native.
 *
 *     plain_blocks(raw, prefix, suffix, longest, event_tail) -> (texts, events) | None
 *
 * Each block of the read is ``prefix`` + text + ``suffix``; texts is a list of the texts
 * (str), events a tuple of their bodies (``{"delta":"`` + text + ``event_tail``, bytes;
 * None for an empty text). The translator is asked in Python, after this (rule 2 there).
 *
 * Rules:
 *
 * N1. The pure function's answer for every input, and by the same steps: each branch
 *     below is a line of ``plain_blocks`` or ``_several``, in their order (the start
 *     and end, the bare test, the length cap, bytes.split's pieces with the last one
 *     dropped, ValueError for an empty suffix where split raises it). Any difference
 *     is a bug here: tests/pipeline/test_plain_delta_native.py and the fuzz target
 *     ``plain_blocks`` (tests/fuzz) compare the two over recorded and hostile reads.
 * N2. The read is vLLM's bytes, untrusted: every pointer below stays inside its
 *     bytes object (each read is checked against the object's length first: see each
 *     memcmp/memchr), nothing is written but the objects made here, at their exact
 *     size (an overflowing size is a MemoryError), and there is no fixed buffer.
 * N3. UTF-8 is CPython's own decoder (PyUnicode_DecodeUTF8, strict: bytes.decode's):
 *     truncated sequences, overlongs and surrogates are refused exactly as in Python.
 *     A UnicodeDecodeError means None for the read; any other error (no memory)
 *     propagates as an exception, with everything made so far released.
 * N4. Each object made here has one owner: the function's locals until it returns them
 *     (texts and events, then the pair) or releases them at ``fail``; a reference
 *     taken by a list or tuple is the one stolen or added by that call, nothing else.
 * N5. No state and no threads: a function of its arguments, run under the GIL.
 * N6. ``longest`` is any int: one past what a Py_ssize_t holds compares as the
 *     largest (or smallest) Py_ssize_t, which orders it against every length as Python
 *     does. The other arguments are bytes (a TypeError otherwise).
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <string.h>

static const char EVENT_HEAD[] = "{\"delta\":\"";
#define EVENT_HEAD_SIZE ((Py_ssize_t)(sizeof(EVENT_HEAD) - 1))

/* The bytes hold no quote, backslash or control byte (_plain_delta's _NOT_BARE). */
static int
is_bare(const unsigned char *text, Py_ssize_t size)
{
    for (Py_ssize_t i = 0; i < size; i++) {
        unsigned char c = text[i];
        if (c < 0x20 || c == '"' || c == '\\') {
            return 0;
        }
    }
    return 1;
}

/* Where needle (needle_size > 0) first starts in hay[from:size], or -1: bytes.find.
 * A start at ``at`` <= size - needle_size keeps the compared bytes inside hay (N2). */
static Py_ssize_t
find(const char *hay, Py_ssize_t size, Py_ssize_t from, const char *needle,
     Py_ssize_t needle_size)
{
    Py_ssize_t last = size - needle_size;
    for (Py_ssize_t at = from; at <= last; at++) {
        const char *hit = memchr(hay + at, needle[0], (size_t)(last - at + 1));
        if (hit == NULL) {
            return -1;
        }
        at = hit - hay;
        if (memcmp(hit, needle, (size_t)needle_size) == 0) {
            return at;
        }
    }
    return -1;
}

/* Rule 3's body: EVENT_HEAD + text + tail, a new bytes object (NULL: an error set). */
static PyObject *
event_body(const char *text, Py_ssize_t text_size, const char *tail, Py_ssize_t tail_size)
{
    if (text_size > PY_SSIZE_T_MAX - EVENT_HEAD_SIZE - tail_size) {
        return PyErr_NoMemory();
    }
    PyObject *body = PyBytes_FromStringAndSize(NULL, EVENT_HEAD_SIZE + text_size + tail_size);
    if (body == NULL) {
        return NULL;
    }
    char *out = PyBytes_AS_STRING(body);
    memcpy(out, EVENT_HEAD, (size_t)EVENT_HEAD_SIZE);
    memcpy(out + EVENT_HEAD_SIZE, text, (size_t)text_size);
    memcpy(out + EVENT_HEAD_SIZE + text_size, tail, (size_t)tail_size);
    return body;
}

/* One block's text: its str appended to texts and its body (or None) to events.
 * 1: done; 0: not UTF-8 (no error set: the read is None); -1: an error set. */
static int
take_text(PyObject *texts, PyObject *events, const char *text, Py_ssize_t text_size,
          const char *tail, Py_ssize_t tail_size)
{
    PyObject *decoded = PyUnicode_DecodeUTF8(text, text_size, "strict");
    if (decoded == NULL) {
        if (PyErr_ExceptionMatches(PyExc_UnicodeDecodeError)) {
            PyErr_Clear();
            return 0;
        }
        return -1;
    }
    int failed = PyList_Append(texts, decoded);
    Py_DECREF(decoded);
    if (failed) {
        return -1;
    }
    PyObject *body = text_size ? event_body(text, text_size, tail, tail_size) : Py_NewRef(Py_None);
    if (body == NULL) {
        return -1;
    }
    failed = PyList_Append(events, body);
    Py_DECREF(body);
    return failed ? -1 : 1;
}

/* ``longest`` as a Py_ssize_t, clamped (N6); -1 with an error set for a non-int. */
static int
as_length(PyObject *value, Py_ssize_t *length)
{
    int overflow = 0;
    long long number = PyLong_AsLongLongAndOverflow(value, &overflow);
    if (number == -1 && !overflow && PyErr_Occurred()) {
        return -1;
    }
    if (overflow > 0 || number > PY_SSIZE_T_MAX) {
        *length = PY_SSIZE_T_MAX;
    }
    else if (overflow < 0 || number < PY_SSIZE_T_MIN) {
        *length = PY_SSIZE_T_MIN;
    }
    else {
        *length = (Py_ssize_t)number;
    }
    return 0;
}

static PyObject *
plain_blocks(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5) {
        PyErr_Format(PyExc_TypeError, "plain_blocks() takes 5 arguments (%zd given)", nargs);
        return NULL;
    }
    static const int bytes_args[] = {0, 1, 2, 4};
    for (size_t i = 0; i < sizeof(bytes_args) / sizeof(bytes_args[0]); i++) {
        if (!PyBytes_Check(args[bytes_args[i]])) {
            PyErr_Format(PyExc_TypeError, "plain_blocks() argument %d must be bytes, not %.100s",
                         bytes_args[i] + 1, Py_TYPE(args[bytes_args[i]])->tp_name);
            return NULL;
        }
    }
    Py_ssize_t longest;
    if (as_length(args[3], &longest) < 0) {
        return NULL;
    }
    const char *raw = PyBytes_AS_STRING(args[0]);
    const char *prefix = PyBytes_AS_STRING(args[1]);
    const char *suffix = PyBytes_AS_STRING(args[2]);
    const char *tail = PyBytes_AS_STRING(args[4]);
    Py_ssize_t raw_size = PyBytes_GET_SIZE(args[0]), prefix_size = PyBytes_GET_SIZE(args[1]);
    Py_ssize_t suffix_size = PyBytes_GET_SIZE(args[2]), tail_size = PyBytes_GET_SIZE(args[4]);

    /* raw.startswith(prefix) and raw.endswith(suffix) */
    if (raw_size < prefix_size || memcmp(raw, prefix, (size_t)prefix_size) != 0
            || raw_size < suffix_size
            || memcmp(raw + raw_size - suffix_size, suffix, (size_t)suffix_size) != 0) {
        Py_RETURN_NONE;
    }
    Py_ssize_t start = prefix_size, end = raw_size - suffix_size;
    if (end < start) {
        Py_RETURN_NONE;
    }
    int several = !is_bare((const unsigned char *)raw + start, end - start);
    if (several && suffix_size == 0) {
        PyErr_SetString(PyExc_ValueError, "empty separator");  /* bytes.split's (N1) */
        return NULL;
    }
    if (!several && end > longest) {
        Py_RETURN_NONE;
    }

    PyObject *texts = PyList_New(0), *events = PyList_New(0), *events_tuple, *found;
    int taken;
    if (texts == NULL || events == NULL) {
        goto fail;
    }
    if (!several) {
        taken = take_text(texts, events, raw + start, end - start, tail, tail_size);
        if (taken <= 0) {
            goto refused;
        }
    }
    else {
        /* _several: the pieces of raw.split(suffix) before the last (what follows the
         * last suffix found), each a block. */
        Py_ssize_t at = 0, hit;
        while ((hit = find(raw, raw_size, at, suffix, suffix_size)) >= 0) {
            const char *block = raw + at;
            Py_ssize_t block_size = hit - at;
            if (block_size < prefix_size || memcmp(block, prefix, (size_t)prefix_size) != 0
                    || block_size > longest
                    || !is_bare((const unsigned char *)block + prefix_size,
                                block_size - prefix_size)) {
                taken = 0;
                goto refused;
            }
            taken = take_text(texts, events, block + prefix_size, block_size - prefix_size,
                              tail, tail_size);
            if (taken <= 0) {
                goto refused;
            }
            at = hit + suffix_size;
        }
    }
    events_tuple = PyList_AsTuple(events);
    if (events_tuple == NULL) {
        goto fail;
    }
    found = PyTuple_Pack(2, texts, events_tuple);
    Py_DECREF(events_tuple);
    Py_DECREF(texts);
    Py_DECREF(events);
    return found;  /* NULL (an error set) where the pair could not be made */

refused:  /* taken: 0, the read is not plain deltas; -1, an error is set */
    if (taken < 0) {
        goto fail;
    }
    Py_DECREF(texts);
    Py_DECREF(events);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(texts);
    Py_XDECREF(events);
    return NULL;
}

static PyMethodDef methods[] = {
    {"plain_blocks", (PyCFunction)(void (*)(void))plain_blocks, METH_FASTCALL,
     "plain_blocks(raw, prefix, suffix, longest, event_tail, /)\n--\n\n"
     "gateway.pipeline._plain_delta.plain_blocks in C: the read's texts and event bodies,\n"
     "or None where any block is not the plain text delta."},
    {NULL, NULL, 0, NULL},
};

static PyModuleDef_Slot slots[] = {
#if PY_VERSION_HEX >= 0x030C0000
    {Py_mod_multiple_interpreters, Py_MOD_PER_INTERPRETER_GIL_SUPPORTED},
#endif
    {0, NULL},
};

static struct PyModuleDef module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "gateway.pipeline._plain_delta_native",
    .m_doc = "The plain text delta's byte work in C (gateway/pipeline/_plain_delta.py rule 7).",
    .m_size = 0,
    .m_methods = methods,
    .m_slots = slots,
};

PyMODINIT_FUNC
PyInit__plain_delta_native(void)
{
    return PyModuleDef_Init(&module_def);
}
