/*
 * The capture's per-tensor hot path (``Recording.slot`` of nbdebug/frameworks/core/recording.py) in C.
 *
 * Included by _fastats.c (one extension module, one translation unit).  Exported as ``_fastats.slot``, a
 * method descriptor: the capture core's class uses it as its ``slot`` method, so ``self.slot(node, s, t,
 * as_input=True)`` calls straight into C, with no Python frame.  It does what the Python method does, in the
 * same order, on the same Python objects (nothing of its own to keep in step with them):
 *
 *   - the tensor's record of this step: ``self._seen[id(t)]`` when its version and weak reference still
 *     match, else ``self.measure(self.buf, t, version)`` (the framework's measurement, a call back);
 *   - the recorder's row (``session.recorder``: its keys/rows/dtypes/shapes/counts lists, index and by_node
 *     maps, as ``StepRecorder.add``), the node's shape and dtype of the slot;
 *   - retention: the handle made by ``self.ops.reference`` and offered with ``session.store.offer`` (calls back);
 *   - an input's edge from its producer (``session.graph``: edges, _succ, _pred, version, as ``Graph.add_edge``),
 *     the origin node of a tensor nobody produced made by ``self.origin`` (a call back).
 *
 * Anything uncommon -- metadata deferred by the framework, an unsupported tensor, a dump tap, a pinned
 * node, a value over the memory budget -- goes to the Python method ``self._record`` once the tensor's
 * record is settled, before anything else is written: that method is the reference of the behaviour.
 * Nothing here imports anything: every object comes in through ``self``.
 */

#include <structmember.h> /* T_OBJECT_EX: the type of a __slots__ member */

static PyObject *S__seen, *S_version, *S_measure, *S_buf, *S_ref, *S_dtype, *S_why, *S_tap, *S_session, *S_name,
    *S_recorder, *S_row, *S_shape, *S_count, *S_shapes, *S_dtypes, *S_pinned, *S_retain, *S_section,
    *S_optimizer, *S_store, *S_handle, *S_nbytes, *S_used, *S_budget, *S_ops, *S_reference, *S_retain_copy,
    *S_copied, *S_snapshot, *S_offer, *S_producer, *S_origin, *S_graph, *S__also, *S__record, *S_keys, *S_rows,
    *S_counts, *S_index, *S_by_node, *S_edges, *S__succ, *S__pred, *S_as_input, *S_copy, *S_keep, *ONE;

static PyObject *S_is_cpu, *S_layout, *S_is_contiguous, *S_contiguous, *S_data_ptr, *S_fast, *S__n, *S__cap,
    *S__ptr, *S__version, *S___tensor_flatten__;

static int rec_intern(void) {
#define INTERN(var, text)                                  \
    if ((var = PyUnicode_InternFromString(text)) == NULL) \
        return -1;
    INTERN(S__seen, "_seen") INTERN(S_version, "version") INTERN(S_measure, "measure") INTERN(S_buf, "buf")
    INTERN(S_ref, "ref") INTERN(S_dtype, "dtype") INTERN(S_why, "why") INTERN(S_tap, "tap")
    INTERN(S_session, "session") INTERN(S_name, "name") INTERN(S_recorder, "recorder") INTERN(S_row, "row")
    INTERN(S_shape, "shape") INTERN(S_count, "count") INTERN(S_shapes, "shapes") INTERN(S_dtypes, "dtypes")
    INTERN(S_pinned, "pinned") INTERN(S_retain, "retain") INTERN(S_section, "section")
    INTERN(S_optimizer, "optimizer") INTERN(S_store, "store") INTERN(S_handle, "handle")
    INTERN(S_nbytes, "nbytes") INTERN(S_used, "used") INTERN(S_budget, "budget") INTERN(S_ops, "ops")
    INTERN(S_reference, "reference") INTERN(S_retain_copy, "retain_copy") INTERN(S_copied, "copied")
    INTERN(S_snapshot, "snapshot") INTERN(S_offer, "offer") INTERN(S_producer, "producer")
    INTERN(S_origin, "origin") INTERN(S_graph, "graph") INTERN(S__also, "_also") INTERN(S__record, "_record")
    INTERN(S_keys, "keys") INTERN(S_rows, "rows") INTERN(S_counts, "counts") INTERN(S_index, "index")
    INTERN(S_by_node, "by_node") INTERN(S_edges, "edges") INTERN(S__succ, "_succ") INTERN(S__pred, "_pred")
    INTERN(S_as_input, "as_input") INTERN(S_copy, "copy") INTERN(S_keep, "keep")
    INTERN(S_is_cpu, "is_cpu") INTERN(S_layout, "layout") INTERN(S_is_contiguous, "is_contiguous")
    INTERN(S_contiguous, "contiguous") INTERN(S_data_ptr, "data_ptr") INTERN(S_fast, "fast") INTERN(S__n, "_n")
    INTERN(S__cap, "_cap") INTERN(S__ptr, "_ptr") INTERN(S__version, "_version") INTERN(S___tensor_flatten__, "__tensor_flatten__")
#undef INTERN
    return (ONE = PyLong_FromLong(1)) == NULL ? -1 : 0;
}

enum { SEEN_REF, SEEN_VERSION, SEEN_ROW, SEEN_DTYPE, SEEN_WHY, SEEN_SHAPE, SEEN_COUNT, SEEN_NBYTES, SEEN_HANDLE,
       SEEN_PRODUCER, SEEN_COPY, SEEN_N };
static const char *const SEEN_FIELDS[SEEN_N] = {"ref",   "version", "row",    "dtype",    "why",  "shape",
                                                "count", "nbytes",  "handle", "producer", "copy"};
static PyTypeObject *seen_type = NULL;          /* the Seen class, NULL until measure_setup */
static Py_ssize_t seen_off[SEEN_N];             /* byte offset of each slot in a Seen */

#define SEEN_SLOT(o, k) (*(PyObject **)((char *)(o) + seen_off[k]))

/* ``seen.<field>`` (a new reference): read in place when ``seen`` is a Seen of the checked layout */
static PyObject *seen_get(PyObject *seen, int k, PyObject *name) {
    if (seen_type != NULL && Py_TYPE(seen) == seen_type) {
        PyObject *v = SEEN_SLOT(seen, k);
        if (v != NULL) {
            Py_INCREF(v);
            return v;
        }
    }
    return PyObject_GetAttr(seen, name);
}

/* ``seen.<field> = value`` */
static int seen_set(PyObject *seen, int k, PyObject *name, PyObject *value) {
    if (seen_type != NULL && Py_TYPE(seen) == seen_type) {
        Py_INCREF(value);
        Py_XSETREF(SEEN_SLOT(seen, k), value);
        return 0;
    }
    return PyObject_SetAttr(seen, name, value);
}

/* ``o.<name>`` for a __slots__ member, read in place: (type, name) -> offset, found once per type */
#define MCACHE 16
static struct {
    PyObject *name;
    PyTypeObject *type;
    Py_ssize_t off;
} mcache[MCACHE];
static int mcache_n = 0;

static PyObject *member_get(PyObject *o, PyObject *name) {
    PyTypeObject *tp = Py_TYPE(o);
    for (int k = 0; k < mcache_n; k++) {
        if (mcache[k].name == name && mcache[k].type == tp) {
            PyObject *v = *(PyObject **)((char *)o + mcache[k].off);
            if (v == NULL) return PyObject_GetAttr(o, name); /* unset: the AttributeError */
            Py_INCREF(v);
            return v;
        }
    }
    PyObject *d = _PyType_Lookup(tp, name); /* borrowed */
    if (mcache_n < MCACHE && d != NULL && Py_IS_TYPE(d, &PyMemberDescr_Type) &&
        ((PyMemberDescrObject *)d)->d_member->type == T_OBJECT_EX) {
        Py_INCREF(tp);
        Py_INCREF(name);
        mcache[mcache_n].name = name, mcache[mcache_n].type = tp;
        mcache[mcache_n].off = ((PyMemberDescrObject *)d)->d_member->offset;
        mcache_n++;
        return member_get(o, name);
    }
    return PyObject_GetAttr(o, name);
}

/* ``ref()`` of a Seen's reference (a weak reference, or any callable): a new reference, NULL on error. */
static PyObject *rec_deref(PyObject *ref) {
    if (PyWeakref_CheckRef(ref)) {
        PyObject *o = PyWeakref_GetObject(ref);
        if (o == NULL) return NULL;
        Py_INCREF(o);
        return o;
    }
    return PyObject_CallNoArgs(ref);
}

/* Whether ``seen.ref() is t``: 1, 0, or -1 on error. */
static int rec_refers_to(PyObject *seen, PyObject *t) {
    PyObject *ref = seen_get(seen, SEEN_REF, S_ref);
    if (ref == NULL) return -1;
    PyObject *o = rec_deref(ref);
    Py_DECREF(ref);
    if (o == NULL) return -1;
    int out = o == t;
    Py_DECREF(o);
    return out;
}

/* ``d.get(key)``: a new reference; NULL with no error set when missing, NULL with one on error. */
static PyObject *rec_get(PyObject *d, PyObject *key) {
    if (PyDict_Check(d)) {
        PyObject *v = PyDict_GetItemWithError(d, key);
        Py_XINCREF(v);
        return v;
    }
    PyObject *v = PyObject_GetItem(d, key);
    if (v == NULL && PyErr_ExceptionMatches(PyExc_KeyError)) PyErr_Clear();
    return v;
}

/* ``obj.attr[key] = value`` */
static int rec_set_in(PyObject *obj, PyObject *attr, PyObject *key, PyObject *value) {
    PyObject *d = PyObject_GetAttr(obj, attr);
    if (d == NULL) return -1;
    int rc = PyObject_SetItem(d, key, value);
    Py_DECREF(d);
    return rc;
}

/* ``rec.<attr>.append(value)`` / ``rec.<attr>[i] = value`` */
static int rec_list_put(PyObject *rec, PyObject *attr, Py_ssize_t i, PyObject *value) {
    PyObject *lst = member_get(rec, attr);
    if (lst == NULL) return -1;
    int rc;
    if (i < 0)
        rc = PyList_Check(lst) ? PyList_Append(lst, value) : -1;
    else
        rc = PyList_Check(lst) ? (Py_INCREF(value), PyList_SetItem(lst, i, value)) : -1;
    if (rc < 0 && !PyErr_Occurred()) PyErr_SetString(PyExc_TypeError, "slot(): the recorder's columns are lists");
    Py_DECREF(lst);
    return rc;
}

/* StepRecorder.add(key, row, dtype, shape, count) */
static int rec_add(PyObject *rec, PyObject *key, PyObject *row, PyObject *dtype, PyObject *shape, PyObject *count) {
    PyObject *index = member_get(rec, S_index);
    if (index == NULL) return -1;
    PyObject *i = PyDict_GetItemWithError(index, key); /* borrowed */
    if (i != NULL) {                                   /* re-recorded within the step: keep the latest */
        Py_ssize_t k = PyLong_AsSsize_t(i);
        Py_DECREF(index);
        if (k == -1 && PyErr_Occurred()) return -1;
        if (rec_list_put(rec, S_rows, k, row) < 0 || rec_list_put(rec, S_dtypes, k, dtype) < 0 ||
            rec_list_put(rec, S_shapes, k, shape) < 0 || rec_list_put(rec, S_counts, k, count) < 0)
            return -1;
        return 0;
    }
    if (PyErr_Occurred()) goto fail_index;
    PyObject *keys = member_get(rec, S_keys);
    if (keys == NULL) goto fail_index;
    PyObject *n = PyLong_FromSsize_t(PyObject_Length(keys));
    Py_DECREF(keys);
    if (n == NULL) goto fail_index;
    int rc = PyDict_SetItem(index, key, n);
    Py_DECREF(index);
    if (rc < 0) goto fail_n;
    PyObject *by_node = member_get(rec, S_by_node);
    if (by_node == NULL) goto fail_n;
    PyObject *node_name = PyTuple_GET_ITEM(key, 0);
    PyObject *rows = PyDict_GetItemWithError(by_node, node_name); /* borrowed */
    if (rows != NULL) {
        rc = PyList_Append(rows, n);
    } else if (PyErr_Occurred()) {
        rc = -1;
    } else {
        PyObject *fresh = PyList_New(1);
        rc = -1;
        if (fresh != NULL) {
            Py_INCREF(n);
            PyList_SET_ITEM(fresh, 0, n);
            rc = PyDict_SetItem(by_node, node_name, fresh);
            Py_DECREF(fresh);
        }
    }
    Py_DECREF(by_node);
    Py_DECREF(n);
    if (rc < 0) return -1;
    if (rec_list_put(rec, S_keys, -1, key) < 0 || rec_list_put(rec, S_rows, -1, row) < 0 ||
        rec_list_put(rec, S_dtypes, -1, dtype) < 0 || rec_list_put(rec, S_shapes, -1, shape) < 0 ||
        rec_list_put(rec, S_counts, -1, count) < 0)
        return -1;
    return 0;
fail_index:
    Py_DECREF(index);
    return -1;
fail_n:
    Py_DECREF(n);
    return -1;
}

/* ``d.setdefault(key, set()).add(item)`` */
static int rec_set_add(PyObject *d, PyObject *key, PyObject *item) {
    PyObject *s = PyDict_GetItemWithError(d, key); /* borrowed */
    if (s != NULL) return PySet_Add(s, item);
    if (PyErr_Occurred()) return -1;
    PyObject *fresh = PySet_New(NULL);
    if (fresh == NULL) return -1;
    int rc = PySet_Add(fresh, item) < 0 ? -1 : PyDict_SetItem(d, key, fresh);
    Py_DECREF(fresh);
    return rc;
}

/* Graph.add_edge(src, dst, src_slot, dst_slot) */
static int rec_edge(PyObject *graph, PyObject *src, PyObject *dst, PyObject *src_slot, PyObject *dst_slot) {
    int same = PyObject_RichCompareBool(src, dst, Py_EQ);
    if (same != 0) return same < 0 ? -1 : 0;
    PyObject *edges = PyObject_GetAttr(graph, S_edges);
    if (edges == NULL) return -1;
    PyObject *key = PyTuple_Pack(2, src, dst), *pair = PyTuple_Pack(2, src_slot, dst_slot);
    int rc = -1;
    if (key == NULL || pair == NULL) goto done;
    PyObject *slots = PyDict_GetItemWithError(edges, key); /* borrowed */
    if (slots != NULL) {
        int has = PySequence_Contains(slots, pair);
        rc = has < 0 ? -1 : has ? 0 : PyList_Append(slots, pair);
        goto done;
    }
    if (PyErr_Occurred()) goto done;
    PyObject *fresh = PyList_New(1);
    if (fresh == NULL) goto done;
    Py_INCREF(pair);
    PyList_SET_ITEM(fresh, 0, pair);
    rc = PyDict_SetItem(edges, key, fresh);
    Py_DECREF(fresh);
    if (rc < 0) goto done;
    PyObject *succ = PyObject_GetAttr(graph, S__succ), *pred = PyObject_GetAttr(graph, S__pred);
    rc = -1;
    if (succ != NULL && pred != NULL && rec_set_add(succ, src, dst) == 0 && rec_set_add(pred, dst, src) == 0) {
        PyObject *v = PyObject_GetAttr(graph, S_version);
        PyObject *v1 = v != NULL ? PyNumber_Add(v, ONE) : NULL;
        rc = v1 != NULL ? PyObject_SetAttr(graph, S_version, v1) : -1;
        Py_XDECREF(v);
        Py_XDECREF(v1);
    }
    Py_XDECREF(succ);
    Py_XDECREF(pred);
done:
    Py_XDECREF(key);
    Py_XDECREF(pair);
    Py_DECREF(edges);
    return rc;
}

/* An edge from ``producer`` = (node name, slot) into ``name``'s ``slot``. */
static int rec_edge_from(PyObject *graph, PyObject *producer, PyObject *name, PyObject *slot) {
    if (!PyTuple_Check(producer) || PyTuple_GET_SIZE(producer) != 2) {
        PyErr_Format(PyExc_TypeError, "slot(): a producer is a (node, slot) tuple, got %R", producer);
        return -1;
    }
    return rec_edge(graph, PyTuple_GET_ITEM(producer, 0), name, PyTuple_GET_ITEM(producer, 1), slot);
}

/* Parse ``slot(node, slot, t, *, as_input, copy=False, origin=True, keep=True)`` (positional too). */
static int rec_args(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames, PyObject **out) {
    static PyObject **const names[4] = {&S_as_input, &S_copy, &S_origin, &S_keep};
    out[3] = NULL, out[4] = Py_False, out[5] = Py_True, out[6] = Py_True;
    if (nargs < 3 || nargs > 7) {
        PyErr_SetString(PyExc_TypeError, "slot(node, slot, t, *, as_input, copy=False, origin=True, keep=True)");
        return -1;
    }
    for (Py_ssize_t k = 0; k < nargs; k++) out[k] = args[k];
    Py_ssize_t nkw = kwnames == NULL ? 0 : PyTuple_GET_SIZE(kwnames);
    for (Py_ssize_t k = 0; k < nkw; k++) {
        PyObject *kw = PyTuple_GET_ITEM(kwnames, k);
        int found = -1;
        for (int j = 0; j < 4 && found < 0; j++)
            if (kw == *names[j] || PyUnicode_Compare(kw, *names[j]) == 0) found = j;
        if (found < 0 || 3 + found < nargs) {
            PyErr_Format(PyExc_TypeError, "slot() got an unexpected or repeated keyword argument %R", kw);
            return -1;
        }
        out[3 + found] = args[nargs + k];
    }
    if (out[3] == NULL) {
        PyErr_SetString(PyExc_TypeError, "slot() missing the keyword argument 'as_input'");
        return -1;
    }
    return 0;
}

/* The tensor's record of this step (``Recording.slot``'s first part): a new reference, NULL on error. */
static PyObject *rec_seen(PyObject *self, PyObject *t, PyObject *tid) {
    PyObject *seen_d = NULL, *fn = NULL, *ver = NULL, *seen = NULL, *sv = NULL, *buf = NULL, *fresh = NULL;
    PyObject *out = NULL;
    int hit = 0;
    if ((seen_d = PyObject_GetAttr(self, S__seen)) == NULL || (fn = PyObject_GetAttr(self, S_version)) == NULL ||
        (ver = PyObject_CallOneArg(fn, t)) == NULL)
        goto done;
    seen = rec_get(seen_d, tid);
    if (seen == NULL) {
        if (PyErr_Occurred()) goto done;
    } else if (seen != Py_None) {
        if ((sv = seen_get(seen, SEEN_VERSION, S_version)) == NULL) goto done;
        int ne = PyObject_RichCompareBool(sv, ver, Py_NE);
        if (ne < 0) goto done;
        hit = ne ? 0 : rec_refers_to(seen, t);
        if (hit < 0) goto done;
    }
    if (hit) {
        out = seen, seen = NULL;
        goto done;
    }
    int same = seen != NULL && seen != Py_None ? rec_refers_to(seen, t) : 0; /* modified in place unseen */
    if (same < 0) goto done;
    Py_CLEAR(fn);
    if ((fn = PyObject_GetAttr(self, S_measure)) == NULL || (buf = PyObject_GetAttr(self, S_buf)) == NULL)
        goto done;
    PyObject *margs[3] = {buf, t, ver};
    if ((fresh = PyObject_Vectorcall(fn, margs, 3, NULL)) == NULL) goto done;
    if (same) {
        PyObject *p = seen_get(seen, SEEN_PRODUCER, S_producer);
        int rc = p == NULL ? -1 : seen_set(fresh, SEEN_PRODUCER, S_producer, p);
        Py_XDECREF(p);
        if (rc < 0) goto done;
    }
    if (PyObject_SetItem(seen_d, tid, fresh) < 0) goto done;
    out = fresh, fresh = NULL;
done:
    Py_XDECREF(seen_d), Py_XDECREF(fn), Py_XDECREF(ver), Py_XDECREF(seen), Py_XDECREF(sv), Py_XDECREF(buf);
    Py_XDECREF(fresh);
    return out;
}

/* Whether ``pinned`` (a set of node names, possibly empty) holds ``name``: 1, 0, -1 on error. */
static int rec_pinned(PyObject *session, PyObject *name) {
    PyObject *pinned = PyObject_GetAttr(session, S_pinned);
    if (pinned == NULL) return -1;
    int out = PyObject_IsTrue(pinned);
    if (out > 0) out = PySequence_Contains(pinned, name);
    Py_DECREF(pinned);
    return out;
}

/* Whether a value of ``nbytes`` (None: unknown) would exceed the store's budget: 1, 0, -1 on error. */
static int rec_over_budget(PyObject *store, PyObject *nbytes) {
    if (nbytes == Py_None) return 0;
    PyObject *used = PyObject_GetAttr(store, S_used), *budget = PyObject_GetAttr(store, S_budget), *sum = NULL;
    int out = -1;
    if (used != NULL && budget != NULL && (sum = PyNumber_Add(used, nbytes)) != NULL)
        out = PyObject_RichCompareBool(sum, budget, Py_GT);
    Py_XDECREF(used), Py_XDECREF(budget), Py_XDECREF(sum);
    return out;
}

/* The value's retention (``keep`` of a node whose values are retained): handle made once, offered. */
static int rec_retain(PyObject *self, PyObject *store, PyObject *seen, PyObject *key, PyObject *t, PyObject *copy) {
    PyObject *handle = seen_get(seen, SEEN_HANDLE, S_handle), *res = NULL;
    int rc = -1;
    if (handle == NULL) return -1;
    if (handle == Py_None) {
        PyObject *ops = PyObject_GetAttr(self, S_ops), *how = NULL;
        int c = PyObject_IsTrue(copy);
        if (ops != NULL && c >= 0) {
            how = c ? (Py_INCREF(copy), copy) : PyObject_GetAttr(self, S_retain_copy);
            PyObject *margs[4] = {ops, t, seen, how};
            Py_SETREF(handle, how == NULL ? NULL : PyObject_VectorcallMethod(S_reference, margs, 4, NULL));
        } else {
            Py_CLEAR(handle);
        }
        Py_XDECREF(ops), Py_XDECREF(how);
        if (handle == NULL || seen_set(seen, SEEN_HANDLE, S_handle, handle) < 0) goto done;
    } else {
        int c = PyObject_IsTrue(copy);
        if (c < 0) goto done;
        if (c) { /* first kept by reference (an op's input): a parameter keeps the value the model used */
            PyObject *copied = PyObject_GetAttr(handle, S_copied);
            int done_ = copied == NULL ? -1 : PyObject_IsTrue(copied);
            Py_XDECREF(copied);
            if (done_ < 0) goto done;
            if (!done_ && (res = PyObject_CallMethodNoArgs(handle, S_snapshot)) == NULL) goto done;
            Py_CLEAR(res);
        }
    }
    PyObject *oargs[3] = {store, key, handle};
    res = PyObject_VectorcallMethod(S_offer, oargs, 3, NULL);
    rc = res == NULL ? -1 : 0;
done:
    Py_XDECREF(handle), Py_XDECREF(res);
    return rc;
}

/* An input's edges: from its producer (an origin node made for it when nobody produced it), and from the
 * producers of the other data inputs of the unrecorded call that made it. */
static int rec_input(PyObject *self, PyObject *session, PyObject *seen, PyObject *name, PyObject *slot,
                     PyObject *t, PyObject *tid, PyObject *origin) {
    PyObject *producer = seen_get(seen, SEEN_PRODUCER, S_producer), *graph = NULL, *also = NULL, *extra = NULL;
    int rc = -1;
    if (producer == NULL) return -1;
    if (producer == Py_None) {
        int o = PyObject_IsTrue(origin);
        if (o < 0) goto done;
        if (o) {
            Py_SETREF(producer, PyObject_CallMethodOneArg(self, S_origin, t));
            if (producer == NULL || seen_set(seen, SEEN_PRODUCER, S_producer, producer) < 0) goto done;
        }
    }
    if ((graph = PyObject_GetAttr(session, S_graph)) == NULL) goto done;
    if (producer != Py_None && rec_edge_from(graph, producer, name, slot) < 0) goto done;
    if ((also = PyObject_GetAttr(self, S__also)) == NULL) goto done;
    int any = PyObject_IsTrue(also);
    if (any < 0) goto done;
    if (any) {
        extra = rec_get(also, tid);
        if (extra == NULL) {
            if (PyErr_Occurred()) goto done;
        } else if (extra != Py_None) {
            if (!PyTuple_Check(extra) || PyTuple_GET_SIZE(extra) < 2) {
                PyErr_SetString(PyExc_TypeError, "slot(): _also holds (reference, producers) pairs");
                goto done;
            }
            PyObject *o = rec_deref(PyTuple_GET_ITEM(extra, 0));
            if (o == NULL) goto done;
            Py_DECREF(o);
            if (o == t) {
                PyObject *ps = PySequence_Fast(PyTuple_GET_ITEM(extra, 1), "producers");
                if (ps == NULL) goto done;
                for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(ps); k++) {
                    PyObject *p = PySequence_Fast_GET_ITEM(ps, k);
                    if (rec_edge_from(graph, p, name, slot) < 0) {
                        Py_DECREF(ps);
                        goto done;
                    }
                }
                Py_DECREF(ps);
            }
        }
    }
    rc = 0;
done:
    Py_XDECREF(producer), Py_XDECREF(graph), Py_XDECREF(also), Py_XDECREF(extra);
    return rc;
}

/* Whether the common path records this slot (else ``self._record`` does): 1, 0, -1 on error.  Sets
 * ``*store`` (a new reference) when the value is to be retained. */
static int rec_common(PyObject *self, PyObject *session, PyObject *node, PyObject *name, PyObject *seen,
                      PyObject *keep, PyObject **store) {
    PyObject *v = seen_get(seen, SEEN_DTYPE, S_dtype);
    int ok = v == NULL ? -1 : v != Py_None;
    Py_XDECREF(v);
    if (ok <= 0) return ok;
    v = seen_get(seen, SEEN_WHY, S_why);
    ok = v == NULL ? -1 : v == Py_None;
    Py_XDECREF(v);
    if (ok <= 0) return ok;
    v = PyObject_GetAttr(self, S_tap);
    ok = v == NULL ? -1 : v == Py_None;
    Py_XDECREF(v);
    if (ok <= 0) return ok;
    int k = PyObject_IsTrue(keep);
    if (k <= 0) return k < 0 ? -1 : 1; /* statistics only (the optimizer step's slots): nothing to retain */
    int pinned = rec_pinned(session, name);
    if (pinned != 0) return pinned < 0 ? -1 : 0;
    v = PyObject_GetAttr(self, S_retain);
    int retain = v == NULL ? -1 : PyObject_IsTrue(v);
    Py_XDECREF(v);
    if (retain <= 0) return retain < 0 ? -1 : 1;
    v = PyObject_GetAttr(node, S_section);
    int opt = v == NULL ? -1 : PyObject_RichCompareBool(v, S_optimizer, Py_EQ);
    Py_XDECREF(v);
    if (opt != 0) return opt < 0 ? -1 : 1; /* the optimizer's ops keep statistics only */
    if ((*store = PyObject_GetAttr(session, S_store)) == NULL) return -1;
    v = seen_get(seen, SEEN_HANDLE, S_handle);
    ok = 1;
    if (v == NULL) {
        ok = -1;
    } else if (v == Py_None) { /* over the budget: the store is told the size it refused */
        PyObject *nbytes = seen_get(seen, SEEN_NBYTES, S_nbytes);
        int over = nbytes == NULL ? -1 : rec_over_budget(*store, nbytes);
        Py_XDECREF(nbytes);
        ok = over < 0 ? -1 : !over;
    }
    Py_XDECREF(v);
    if (ok <= 0) Py_CLEAR(*store);
    return ok;
}

/* Recording.slot(node, slot, t, *, as_input, copy=False, origin=True, keep=True) -> Seen */
static PyObject *rec_slot(PyObject *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *a[7];
    if (rec_args(args, nargs, kwnames, a) < 0) return NULL;
    PyObject *node = a[0], *slot = a[1], *t = a[2], *as_input = a[3], *copy = a[4], *origin = a[5], *keep = a[6];
    PyObject *tid = PyLong_FromVoidPtr(t), *seen = NULL, *session = NULL, *name = NULL, *store = NULL;
    PyObject *key = NULL, *rec = NULL, *row = NULL, *dtype = NULL, *shape = NULL, *count = NULL, *out = NULL;
    if (tid == NULL || (seen = rec_seen(self, t, tid)) == NULL) goto done;
    if ((session = PyObject_GetAttr(self, S_session)) == NULL || (name = PyObject_GetAttr(node, S_name)) == NULL)
        goto done;
    int common = rec_common(self, session, node, name, seen, keep, &store);
    if (common < 0) goto done;
    if (!common) { /* the uncommon cases: the Python method, with the record settled */
        PyObject *rargs[9] = {self, seen, node, slot, t, as_input, copy, origin, keep};
        out = PyObject_VectorcallMethod(S__record, rargs, 9, NULL);
        goto done;
    }
    if ((key = PyTuple_Pack(2, name, slot)) == NULL || (rec = PyObject_GetAttr(session, S_recorder)) == NULL ||
        (row = seen_get(seen, SEEN_ROW, S_row)) == NULL || (dtype = seen_get(seen, SEEN_DTYPE, S_dtype)) == NULL ||
        (shape = seen_get(seen, SEEN_SHAPE, S_shape)) == NULL || (count = seen_get(seen, SEEN_COUNT, S_count)) == NULL)
        goto done;
    if (rec_add(rec, key, row, dtype, shape, count) < 0 || rec_set_in(node, S_shapes, slot, shape) < 0 ||
        rec_set_in(node, S_dtypes, slot, dtype) < 0)
        goto done;
    if (store != NULL && rec_retain(self, store, seen, key, t, copy) < 0) goto done;
    int inp = PyObject_IsTrue(as_input);
    if (inp < 0 || (inp && rec_input(self, session, seen, name, slot, t, tid, origin) < 0)) goto done;
    out = seen, seen = NULL;
done:
    Py_XDECREF(tid), Py_XDECREF(seen), Py_XDECREF(session), Py_XDECREF(name), Py_XDECREF(store);
    Py_XDECREF(key), Py_XDECREF(rec), Py_XDECREF(row), Py_XDECREF(dtype), Py_XDECREF(shape), Py_XDECREF(count);
    return out;
}

static PyMethodDef rec_slot_def = {
    "slot", (PyCFunction)(void (*)(void))rec_slot, METH_FASTCALL | METH_KEYWORDS,
    "slot(node, slot, t, *, as_input, copy=False, origin=True, keep=True) -> Seen\n\n"
    "The capture core's Recording.slot in C (a method: use it as a class attribute)."};

/* Adds ``slot`` (a method descriptor of ``object``: any class may hold it as a method) to the module. */
static int rec_init(PyObject *m) {
    if (rec_intern() < 0) return -1;
    PyObject *descr = PyDescr_NewMethod(&PyBaseObject_Type, &rec_slot_def);
    if (descr == NULL) return -1;
    int rc = PyModule_AddObject(m, "slot", descr);
    if (rc < 0) Py_DECREF(descr);
    return rc;
}

/* ------------------------------------------------------------------------------------------ */
/* measure(buf, t, version) -> Seen: StatsBuffer.measure's common case (a dense CPU tensor of a dtype the  */
/* kernel reads, a free row) in C; every other case is the Python ``slow(buf, t, version)``.               */
/* The Seen is made without its __init__: its slots are written directly (the layout is checked at setup). */

static PyObject *m_fast = NULL, *m_strided = NULL, *m_slow = NULL, *m_no_version = NULL;

static int seen_layout(PyTypeObject *type) {
    if (type->tp_dictoffset != 0 || type->tp_init == NULL) return -1;
    for (int k = 0; k < SEEN_N; k++) {
        PyObject *d = PyDict_GetItemString(type->tp_dict, SEEN_FIELDS[k]); /* borrowed */
        if (d == NULL || !PyObject_TypeCheck(d, &PyMemberDescr_Type)) return -1;
        PyMemberDef *m = ((PyMemberDescrObject *)d)->d_member;
        if (m->type != T_OBJECT_EX) return -1;
        seen_off[k] = m->offset;
    }
    return 0;
}

PyDoc_STRVAR(measure_setup_doc,
             "measure_setup(fast, strided, seen_type, slow, no_version=None) -> bool\n\n"
             "Set up measure() and version(): `fast` maps a dtype to (kernel code, name, bytes per element),\n"
             "`strided` is the dense layout, `seen_type` the record class (its slots written directly: False when\n"
             "its layout is not the expected one, and measure() then always calls `slow(buf, t, version)`);\n"
             "`no_version(t)`: version() of a tensor whose `_version` raises RuntimeError (inference tensors).");

static PyObject *fastats_measure_setup(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *fast, *strided, *type, *slow, *no_version = Py_None;
    if (!PyArg_ParseTuple(args, "O!OO!O|O:measure_setup", &PyDict_Type, &fast, &strided, &PyType_Type, &type, &slow,
                          &no_version))
        return NULL;
    Py_INCREF(fast), Py_INCREF(strided), Py_INCREF(slow), Py_INCREF(no_version);
    Py_XSETREF(m_fast, fast);
    Py_XSETREF(m_strided, strided);
    Py_XSETREF(m_slow, slow);
    Py_XSETREF(m_no_version, no_version);
    Py_CLEAR(seen_type);
    if (seen_layout((PyTypeObject *)type) == 0) {
        Py_INCREF(type);
        seen_type = (PyTypeObject *)type;
    }
    return PyBool_FromLong(seen_type != NULL);
}

PyDoc_STRVAR(version_doc,
             "version(t) -> int\n\n"
             "`t._version`; where that raises RuntimeError, measure_setup's `no_version(t)`.");

static PyObject *fastats_version(PyObject *self, PyObject *t) {
    (void)self;
    PyObject *v = PyObject_GetAttr(t, S__version);
    if (v != NULL || m_no_version == NULL || m_no_version == Py_None || !PyErr_ExceptionMatches(PyExc_RuntimeError))
        return v;
    PyErr_Clear();
    return PyObject_CallOneArg(m_no_version, t);
}

/* buf.<name> as a C integer (Py_ssize_t); -1 with an error set on failure */
static int buf_int(PyObject *buf, PyObject *name, Py_ssize_t *out) {
    PyObject *v = PyObject_GetAttr(buf, name);
    if (v == NULL) return -1;
    *out = PyLong_AsSsize_t(v);
    Py_DECREF(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* The common case; NULL with no error set: not one (the caller calls ``slow``). */
static PyObject *measure_fast(PyObject *buf, PyObject *t, PyObject *version) {
    PyObject *v = NULL, *entry, *shape = NULL, *src = NULL, *out = NULL, *ref = NULL;
    /* a wrapper subclass (a DTensor) has no data of its own: its data_ptr() is an offset from NULL */
    if (_PyType_Lookup(Py_TYPE(t), S___tensor_flatten__) != NULL) return NULL;
    if ((v = PyObject_GetAttr(t, S_dtype)) == NULL) return NULL;
    entry = PyDict_GetItemWithError(m_fast, v); /* borrowed */
    Py_CLEAR(v);
    if (entry == NULL || !PyTuple_Check(entry) || PyTuple_GET_SIZE(entry) != 3) return NULL;
    int ok = (v = PyObject_GetAttr(buf, S_fast)) == NULL ? -1 : PyObject_IsTrue(v);
    Py_CLEAR(v);
    if (ok <= 0) return NULL;
    if ((v = PyObject_GetAttr(t, S_is_cpu)) == NULL) return NULL;
    ok = v == Py_True;
    Py_CLEAR(v);
    if (!ok) return NULL;
    if ((v = PyObject_GetAttr(t, S_layout)) == NULL) return NULL;
    ok = v == m_strided;
    Py_CLEAR(v);
    if (!ok) return NULL;
    if ((v = PyObject_GetAttr(t, S_shape)) == NULL) return NULL;
    shape = PySequence_Tuple(v);
    Py_CLEAR(v);
    if (shape == NULL) return NULL;
    Py_ssize_t n = 1;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(shape); k++) {
        Py_ssize_t d = PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, k));
        if (d < 0) { /* not an int (a symbolic size ...): the slow path says */
            PyErr_Clear();
            goto done;
        }
        n *= d;
    }
    Py_ssize_t row, cap, ptr;
    if (n == 0 || buf_int(buf, S__n, &row) < 0 || buf_int(buf, S__cap, &cap) < 0 || row == cap ||
        buf_int(buf, S__ptr, &ptr) < 0)
        goto done;
    long code = PyLong_AsLong(PyTuple_GET_ITEM(entry, 0));
    Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(entry, 2));
    if (code < 0 || code >= DT_COUNT || size <= 0) goto done;
    if ((v = PyObject_CallMethodNoArgs(t, S_is_contiguous)) == NULL) goto done;
    ok = PyObject_IsTrue(v);
    Py_CLEAR(v);
    if (ok < 0) goto done;
    if (ok) {
        Py_INCREF(t);
        src = t;
    } else if ((src = PyObject_CallMethodNoArgs(t, S_contiguous)) == NULL) {
        goto done;
    }
    if ((v = PyObject_CallMethodNoArgs(src, S_data_ptr)) == NULL) { /* no storage (inside torch.vmap): slow */
        if (PyErr_ExceptionMatches(PyExc_RuntimeError)) PyErr_Clear();
        goto done;
    }
    void *data = PyLong_AsVoidPtr(v);
    Py_CLEAR(v);
    if (data == NULL) goto done; /* an error, or no data of its own (a wrapper subclass: DTensor): slow */
    if ((ref = PyWeakref_NewRef(t, NULL)) == NULL) goto done;
    PyObject *nrow = PyLong_FromSsize_t(row + 1);
    if (nrow == NULL) goto done;
    ok = PyObject_SetAttr(buf, S__n, nrow);
    Py_DECREF(nrow);
    if (ok < 0) goto done;
    double *dst = (double *)((char *)ptr + row * 9 * (Py_ssize_t)sizeof(double));
    if (n > GIL_RELEASE_NUMEL) {
        Py_BEGIN_ALLOW_THREADS
        reduce_all((const char *)data, n, (int)code, dst);
        Py_END_ALLOW_THREADS
    } else {
        reduce_all((const char *)data, n, (int)code, dst);
    }
    out = seen_type->tp_alloc(seen_type, 0);
    if (out == NULL) goto done;
    PyObject *vals[SEEN_N] = {ref, version, PyLong_FromSsize_t(row), PyTuple_GET_ITEM(entry, 1), Py_None, shape,
                              PyLong_FromSsize_t(n), PyLong_FromSsize_t(n * size), Py_None, Py_None, Py_None};
    if (vals[SEEN_ROW] == NULL || vals[SEEN_COUNT] == NULL || vals[SEEN_NBYTES] == NULL) {
        Py_XDECREF(vals[SEEN_ROW]), Py_XDECREF(vals[SEEN_COUNT]), Py_XDECREF(vals[SEEN_NBYTES]);
        Py_CLEAR(out);
        goto done;
    }
    Py_INCREF(ref), Py_INCREF(version), Py_INCREF(vals[SEEN_DTYPE]), Py_INCREF(Py_None), Py_INCREF(shape);
    Py_INCREF(Py_None), Py_INCREF(Py_None), Py_INCREF(Py_None);
    for (int k = 0; k < SEEN_N; k++) SEEN_SLOT(out, k) = vals[k]; /* references handed over */
done:
    Py_XDECREF(shape), Py_XDECREF(src), Py_XDECREF(ref);
    return out;
}

PyDoc_STRVAR(measure_doc,
             "measure(buf, t, version) -> Seen\n\n"
             "StatsBuffer.measure: the common case in C, any other through measure_setup's `slow`.");

static PyObject *fastats_measure(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 3) {
        PyErr_SetString(PyExc_TypeError, "measure(buf, t, version)");
        return NULL;
    }
    if (m_slow == NULL) {
        PyErr_SetString(PyExc_RuntimeError, "measure(): measure_setup() was not called");
        return NULL;
    }
    if (seen_type != NULL) {
        PyObject *out = measure_fast(args[0], args[1], args[2]);
        if (out != NULL || PyErr_Occurred()) return out;
    }
    return PyObject_Vectorcall(m_slow, args, 3, NULL);
}
