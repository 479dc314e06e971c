/*
 * ipcount.source._fastread: a read task's records as Arrow buffers, without a Python object per
 * record.
 *
 * confluent-kafka's Consumer.consume() builds one Message object per record, and the task then
 * asks each for its value: ~0.8 us of a record's ~1.8 us of Python CPU. This module takes the
 * same records from the same librdkafka consumer (the Consumer's own rd_kafka_t, so its settings,
 * logging and error callbacks stay confluent-kafka's) and copies each value straight into one data
 * buffer with its end offset beside it: what an Arrow binary array is made of.
 *
 * It reads one partition's own fetch queue, which librdkafka lets an application take over
 * (rd_kafka_queue_get_partition, rd_kafka_queue_forward(q, NULL) before the assignment: the
 * assignment then leaves the queue alone, RD_KAFKA_Q_F_FWD_APP). Records come out of
 * rd_kafka_consume_batch_queue exactly as Consumer.consume() gets them (read_committed filtering,
 * control records, the consumer's position), and error events (an offset reset with
 * auto.offset.reset=error) come in the same order. Nothing else is served from that queue: the
 * consumer's log and error callbacks stay on its main queue, served by confluent-kafka when the
 * consumer closes.
 *
 * No librdkafka header is needed: the few functions are looked up in the librdkafka that
 * confluent-kafka loaded (load(path)), and rd_kafka_message_t is librdkafka's stable public
 * struct. The Python side (ipcount.source.native_reader) checks the consumer handle by its name
 * before reading, and falls back to confluent-kafka's own path when this module is not built.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>

typedef struct rd_kafka_s rd_kafka_t;
typedef struct rd_kafka_queue_s rd_kafka_queue_t;

/* librdkafka's rd_kafka_message_t (rdkafka.h), unchanged since 0.9. */
typedef struct {
    int err;
    void *rkt;
    int32_t partition;
    void *payload;
    size_t len;
    void *key;
    size_t key_len;
    int64_t offset;
    void *_private;
} rk_message_t;

#define RK_CONSUMER 1 /* rd_kafka_type_t RD_KAFKA_CONSUMER */

static struct {
    rd_kafka_queue_t *(*queue_get_partition)(rd_kafka_t *, const char *, int32_t);
    void (*queue_forward)(rd_kafka_queue_t *, rd_kafka_queue_t *);
    void (*queue_destroy)(rd_kafka_queue_t *);
    ssize_t (*consume_batch_queue)(rd_kafka_queue_t *, int, rk_message_t **, size_t);
    void (*message_destroy)(rk_message_t *);
    const char *(*err2str)(int);
    int (*type)(const rd_kafka_t *);
    const char *(*name)(const rd_kafka_t *);
    int loaded;
} rk;

static PyObject *load(PyObject *self, PyObject *args) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path))
        return NULL;
    /* The library confluent-kafka already loaded (RTLD_NOLOAD), else the file at `path`. */
    void *lib = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
    if (!lib)
        lib = dlopen(path, RTLD_NOW);
    if (!lib) {
        PyErr_Format(PyExc_OSError, "cannot load librdkafka from %s: %s", path, dlerror());
        return NULL;
    }
#define RK_SYM(field, symbol)                                                                      \
    do {                                                                                           \
        *(void **)(&rk.field) = dlsym(lib, symbol);                                                \
        if (!rk.field) {                                                                           \
            PyErr_Format(PyExc_OSError, "librdkafka at %s has no %s", path, symbol);              \
            return NULL;                                                                           \
        }                                                                                          \
    } while (0)
    RK_SYM(queue_get_partition, "rd_kafka_queue_get_partition");
    RK_SYM(queue_forward, "rd_kafka_queue_forward");
    RK_SYM(queue_destroy, "rd_kafka_queue_destroy");
    RK_SYM(consume_batch_queue, "rd_kafka_consume_batch_queue");
    RK_SYM(message_destroy, "rd_kafka_message_destroy");
    RK_SYM(err2str, "rd_kafka_err2str");
    RK_SYM(type, "rd_kafka_type");
    RK_SYM(name, "rd_kafka_name");
#undef RK_SYM
    rk.loaded = 1;
    Py_RETURN_NONE;
}

/* confluent-kafka's Handle: PyObject_HEAD, then the rd_kafka_t (confluent_kafka.h); NULL once
 * closed. */
static rd_kafka_t *handle_of(PyObject *consumer) {
    return *(rd_kafka_t **)((char *)consumer + sizeof(PyObject));
}

typedef struct {
    PyObject_HEAD
    rd_kafka_queue_t *queue;
    PyObject *consumer; /* kept alive while the queue is */
    rk_message_t **msgs;
    size_t msgs_cap;
    /* The pending records: values end to end, each one's end offset, and a null flag each. */
    char *data;
    size_t data_len, data_cap;
    int64_t *ends;
    uint8_t *nulls; /* NULL until a value is null */
    size_t count, cap, nulls_cap;
    size_t null_count;
} PartitionQueue;

static void pq_free_buffers(PartitionQueue *q) {
    free(q->msgs);
    free(q->data);
    free(q->ends);
    free(q->nulls);
    q->msgs = NULL;
    q->data = NULL;
    q->ends = NULL;
    q->nulls = NULL;
    q->msgs_cap = q->data_cap = q->cap = q->nulls_cap = q->data_len = q->count = q->null_count = 0;
}

static void pq_release(PartitionQueue *q) {
    if (q->queue) {
        rk.queue_destroy(q->queue);
        q->queue = NULL;
    }
    Py_CLEAR(q->consumer);
}

static int pq_init(PartitionQueue *self, PyObject *args, PyObject *kwds) {
    PyObject *consumer;
    const char *topic, *client_id;
    int partition;
    if (!PyArg_ParseTuple(args, "Osis", &consumer, &topic, &partition, &client_id))
        return -1;
    if (!rk.loaded) {
        PyErr_SetString(PyExc_RuntimeError, "librdkafka not loaded (call load(path) first)");
        return -1;
    }
    rd_kafka_t *h = handle_of(consumer);
    if (!h) {
        PyErr_SetString(PyExc_RuntimeError, "the consumer is closed");
        return -1;
    }
    /* The handle must be this consumer's: librdkafka names it "<client.id>#consumer-<n>". */
    const char *name = rk.name(h);
    size_t id_len = strlen(client_id);
    if (rk.type(h) != RK_CONSUMER || strncmp(name, client_id, id_len) != 0 ||
        name[id_len] != '#') {
        PyErr_Format(PyExc_RuntimeError,
                     "the consumer's librdkafka handle is not where this module expects it "
                     "(confluent-kafka's layout changed?): named %.100s, expected %.100s#...",
                     name, client_id);
        return -1;
    }
    pq_release(self);
    self->queue = rk.queue_get_partition(h, topic, partition);
    if (!self->queue) {
        PyErr_Format(PyExc_RuntimeError, "no fetch queue for %s/%d", topic, partition);
        return -1;
    }
    /* The application's own queue from now on: an assignment no longer forwards it. */
    rk.queue_forward(self->queue, NULL);
    Py_INCREF(consumer);
    self->consumer = consumer;
    return 0;
}

static void pq_dealloc(PartitionQueue *self) {
    pq_release(self);
    pq_free_buffers(self);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int grow(void **buf, size_t *cap, size_t need, size_t item) {
    if (need <= *cap)
        return 0;
    size_t n = *cap ? *cap : 1024;
    while (n < need)
        n *= 2;
    void *p = realloc(*buf, n * item);
    if (!p)
        return -1;
    *buf = p;
    *cap = n;
    return 0;
}

/* Append one value (payload NULL: a null value) to the pending buffers; -1: out of memory. */
static int add_record(PartitionQueue *q, const void *payload, size_t len) {
    if (grow((void **)&q->data, &q->data_cap, q->data_len + len, 1) ||
        grow((void **)&q->ends, &q->cap, q->count + 1, sizeof(int64_t)))
        return -1;
    if (!payload || q->nulls) {
        size_t old = q->nulls ? q->nulls_cap : 0;
        if (!q->nulls)
            q->nulls_cap = 0;
        if (grow((void **)&q->nulls, &q->nulls_cap, q->count + 1, 1))
            return -1;
        if (q->nulls_cap > old) /* the flags of the records before: 0, not null */
            memset(q->nulls + old, 0, q->nulls_cap - old);
        q->nulls[q->count] = payload ? 0 : 1;
        q->null_count += payload ? 0 : 1;
    }
    if (len)
        memcpy(q->data + q->data_len, payload, len);
    q->data_len += len;
    q->ends[q->count] = (int64_t)q->data_len;
    q->count++;
    return 0;
}

/* consume(max_records, timeout_ms, end) -> (returned, pending, pending_bytes, last_offset,
 * error_code, error_text)
 *
 * One rd_kafka_consume_batch_queue call of at most max_records. The records before the first
 * error event whose offset is below `end` are added to the pending buffers; the rest are freed.
 * last_offset: the offset of the last record added by this call (-1: none); error_code: the
 * first error event's code (0: none), error_text its text. */
static PyObject *pq_consume(PartitionQueue *self, PyObject *args) {
    Py_ssize_t max_records;
    int timeout_ms;
    long long end;
    if (!PyArg_ParseTuple(args, "niL", &max_records, &timeout_ms, &end))
        return NULL;
    if (!self->queue) {
        PyErr_SetString(PyExc_RuntimeError, "the partition queue is closed");
        return NULL;
    }
    if (max_records < 1)
        max_records = 1;
    if (grow((void **)&self->msgs, &self->msgs_cap, (size_t)max_records, sizeof(*self->msgs))) {
        return PyErr_NoMemory();
    }
    ssize_t n;
    long long last = -1;
    int err = 0, oom = 0;
    char errtext[512] = "";
    Py_BEGIN_ALLOW_THREADS
    n = rk.consume_batch_queue(self->queue, timeout_ms, self->msgs, (size_t)max_records);
    for (ssize_t i = 0; i < n; i++) {
        rk_message_t *m = self->msgs[i];
        if (!err && !oom && m->err) {
            err = m->err;
            const char *text = m->payload ? (const char *)m->payload : rk.err2str(m->err);
            size_t len = m->payload ? m->len : strlen(text);
            if (len >= sizeof(errtext))
                len = sizeof(errtext) - 1;
            memcpy(errtext, text, len);
            errtext[len] = '\0';
        }
        if (!err && !oom && m->offset < end) {
            size_t len = m->payload ? m->len : 0;
            if (add_record(self, m->payload, len))
                oom = 1;
            else
                last = m->offset;
        }
        rk.message_destroy(m);
    }
    Py_END_ALLOW_THREADS
    if (n < 0) {
        PyErr_SetString(PyExc_RuntimeError, "rd_kafka_consume_batch_queue failed");
        return NULL;
    }
    if (oom)
        return PyErr_NoMemory();
    return Py_BuildValue("nnnLis", (Py_ssize_t)n, (Py_ssize_t)self->count,
                         (Py_ssize_t)self->data_len, last, err, err ? errtext : NULL);
}

/* take() -> (data, ends, nulls): the pending records' values end to end (bytes), each one's end
 * offset in it (bytes of int64, native order), and a flag per record that is 1 for a null value
 * (bytes; None when no value was null). The buffers are then empty. */
static PyObject *pq_take(PartitionQueue *self, PyObject *unused) {
    PyObject *data = PyBytes_FromStringAndSize(self->data ? self->data : "", self->data_len);
    PyObject *ends = PyBytes_FromStringAndSize(self->ends ? (const char *)self->ends : "",
                                               (Py_ssize_t)(self->count * sizeof(int64_t)));
    PyObject *nulls = NULL;
    if (self->null_count)
        nulls = PyBytes_FromStringAndSize((const char *)self->nulls, (Py_ssize_t)self->count);
    else {
        nulls = Py_None;
        Py_INCREF(nulls);
    }
    if (!data || !ends || !nulls) {
        Py_XDECREF(data);
        Py_XDECREF(ends);
        Py_XDECREF(nulls);
        return NULL;
    }
    self->data_len = 0;
    self->count = 0;
    self->null_count = 0;
    free(self->nulls);
    self->nulls = NULL;
    self->nulls_cap = 0;
    return Py_BuildValue("NNN", data, ends, nulls);
}

/* close(): give the queue back (before the consumer closes); the buffers are freed. */
static PyObject *pq_close(PartitionQueue *self, PyObject *unused) {
    pq_release(self);
    pq_free_buffers(self);
    Py_RETURN_NONE;
}

static PyMethodDef pq_methods[] = {
    {"consume", (PyCFunction)pq_consume, METH_VARARGS,
     "consume(max_records, timeout_ms, end) -> (returned, pending, pending_bytes, last_offset, "
     "error_code, error_text)"},
    {"take", (PyCFunction)pq_take, METH_NOARGS, "take() -> (data, ends, nulls)"},
    {"close", (PyCFunction)pq_close, METH_NOARGS, "close(): release the partition's queue"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject PartitionQueueType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "ipcount.source._fastread.PartitionQueue",
    .tp_basicsize = sizeof(PartitionQueue),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "PartitionQueue(consumer, topic, partition, client_id): one partition's fetch "
              "queue of a confluent_kafka.Consumer, taken over before the partition is assigned",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)pq_init,
    .tp_dealloc = (destructor)pq_dealloc,
    .tp_methods = pq_methods,
};

static PyMethodDef module_methods[] = {
    {"load", load, METH_VARARGS, "load(path): find librdkafka's functions in the library at path"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastread",
    "A read task's record values as Arrow buffers, straight from librdkafka", -1, module_methods,
};

PyMODINIT_FUNC PyInit__fastread(void) {
    if (PyType_Ready(&PartitionQueueType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m)
        return NULL;
    Py_INCREF(&PartitionQueueType);
    if (PyModule_AddObject(m, "PartitionQueue", (PyObject *)&PartitionQueueType) < 0) {
        Py_DECREF(&PartitionQueueType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
