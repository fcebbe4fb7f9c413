/* edgekit._ekrt: the CPython binding of ekrt (docs/ekrt.md). Buffer protocol in, numpy arrays
 * out (numpy is imported at run time, never needed to build). The GIL is released while a
 * model runs.
 *
 *   m = _ekrt.Model(b"...ekm bytes..." or "model.ekm")
 *   m.inputs, m.outputs             -> [(name, shape), ...]
 *   m.run([x0, ...]) or m.run({name: x})  -> [y0, ...] (float32 numpy arrays)
 *   m.set_threads(4); m.threads      -> threads run() uses; Model(..., threads=None) and
 *                                      set_threads(None) let ekrt choose (ekrt.h)
 *   m.profile(True); m.run(...); m.op_times() -> [(op_type, ns), ...]
 *   m.partition(threads, op=-1)     -> MACs per thread of ekrt_run's split (ekrt_partition)
 *   _ekrt.isa(), _ekrt.features(), _ekrt.kernels(), _ekrt.built_isas()
 *   _ekrt.quantize_multiplier(r), _ekrt.requant(acc, m, s, zp, qmin, qmax): requant.h, for tests
 *   _ekrt.histogram_add(values, lo, scale, counts, absolute): the calibrator's histograms */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "edgekit/cpu.h"
#include "edgekit/ekrt.h"
#include "edgekit/requant.h"

static PyObject* FormatError;

typedef struct {
  PyObject_HEAD ekrt_model* model;
  int busy;
} ModelObject;

static PyObject* numpy_module(void) {
  static PyObject* np = NULL;
  if (!np) np = PyImport_ImportModule("numpy");
  return np;
}

static PyObject* shape_tuple(int rank, const uint32_t dims[4]) {
  PyObject* t = PyTuple_New(rank);
  if (!t) return NULL;
  for (int d = 0; d < rank; d++) PyTuple_SET_ITEM(t, d, PyLong_FromUnsignedLong(dims[d]));
  return t;
}

/* One-shot: a Model is loaded once (a second __init__ raises), and `busy` marks the load or a
 * run in progress, during which the GIL is released: every other entry point that touches the
 * model refuses then (RuntimeError), so no thread frees or mutates a model another uses. */
static int Model_init(ModelObject* self, PyObject* args, PyObject* kwds) {
  static char* kwlist[] = {"source", "threads", NULL};
  PyObject *source, *threads_arg = Py_None;
  if (!PyArg_ParseTupleAndKeywords(args, kwds, "O|O", kwlist, &source, &threads_arg)) return -1;
  long threads = threads_arg == Py_None ? EKRT_THREADS_AUTO : PyLong_AsLong(threads_arg);
  if (threads == -1 && PyErr_Occurred()) return -1;
  if (threads_arg != Py_None && (threads < 1 || threads > 256)) {
    PyErr_Format(PyExc_ValueError, "threads must be 1..256, not %ld", threads);
    return -1;
  }
  if (self->model || self->busy) {
    PyErr_SetString(PyExc_RuntimeError, "Model() is already initialised; create a new Model to load another file");
    return -1;
  }
  char err[512];
  int rc, threads_rc;
  ekrt_model* model = NULL;
  PyObject* path = NULL;
  Py_buffer view;
  memset(&view, 0, sizeof view);
  if (PyUnicode_Check(source) || PyObject_HasAttrString(source, "__fspath__")) {
    if (!PyUnicode_FSConverter(source, &path)) return -1;
  } else if (PyObject_GetBuffer(source, &view, PyBUF_SIMPLE) != 0) {
    PyErr_Format(PyExc_TypeError, "Model() takes the .ekm bytes or a path, not %.100s", Py_TYPE(source)->tp_name);
    return -1;
  }
  self->busy = 1;
  Py_BEGIN_ALLOW_THREADS;
  rc = path ? ekrt_load_file(PyBytes_AS_STRING(path), &model, err, sizeof err)
            : ekrt_load(view.buf, (size_t)view.len, &model, err, sizeof err);
  threads_rc = rc ? 0 : ekrt_set_threads(model, (int)threads);
  Py_END_ALLOW_THREADS;
  self->busy = 0;
  Py_XDECREF(path);
  if (view.obj) PyBuffer_Release(&view);
  if (rc == EKRT_EIO) {
    PyErr_SetString(PyExc_OSError, err);
    return -1;
  }
  if (rc == EKRT_ENOMEM) {
    PyErr_NoMemory();
    return -1;
  }
  if (rc) {
    PyErr_SetString(FormatError, err[0] ? err : "not a valid .ekm file");
    return -1;
  }
  self->model = model;
  /* the automatic choice is a speed hint: keep the caller's thread when no thread starts */
  if (threads_rc && threads_arg != Py_None) {
    PyErr_Format(PyExc_RuntimeError, "cannot start %ld threads (code %d)", threads, threads_rc);
    return -1;
  }
  return 0;
}

static void Model_dealloc(ModelObject* self) {
  ekrt_free(self->model);
  Py_TYPE(self)->tp_free((PyObject*)self);
}

static int check_model(ModelObject* self) {
  if (!self->model) {
    PyErr_SetString(PyExc_RuntimeError, self->busy ? "the model is still loading in another thread" : "the model is not loaded");
    return -1;
  }
  return 0;
}

/* the model, loaded and not in use by another thread (which runs with the GIL released) */
static int check_idle(ModelObject* self) {
  if (check_model(self)) return -1;
  if (self->busy) {
    PyErr_SetString(PyExc_RuntimeError, "the model is running in another thread (one call at a time per Model)");
    return -1;
  }
  return 0;
}

static PyObject* io_list(ModelObject* self, int is_output) {
  if (check_model(self)) return NULL;
  int n = is_output ? ekrt_num_outputs(self->model) : ekrt_num_inputs(self->model);
  PyObject* list = PyList_New(n);
  if (!list) return NULL;
  for (int i = 0; i < n; i++) {
    const char* name;
    size_t len;
    int rank;
    uint32_t dims[4];
    ekrt_io_info(self->model, is_output, i, &name, &len, &rank, dims);
    PyObject* item = Py_BuildValue("(s#N)", name, (Py_ssize_t)len, shape_tuple(rank, dims));
    if (!item) {
      Py_DECREF(list);
      return NULL;
    }
    PyList_SET_ITEM(list, i, item);
  }
  return list;
}

static PyObject* Model_get_inputs(ModelObject* self, void* Py_UNUSED(c)) {
  return io_list(self, 0);
}
static PyObject* Model_get_outputs(ModelObject* self, void* Py_UNUSED(c)) {
  return io_list(self, 1);
}
static PyObject* Model_get_threads(ModelObject* self, void* Py_UNUSED(c)) {
  if (check_idle(self)) return NULL;
  return PyLong_FromLong(ekrt_get_threads(self->model));
}
static PyObject* Model_get_memory(ModelObject* self, void* Py_UNUSED(c)) {
  if (check_idle(self)) return NULL;
  return PyLong_FromSize_t(ekrt_memory_bytes(self->model));
}

/* a float32 C-contiguous buffer for input i with the io shape (numpy converts other dtypes) */
static int get_input(ModelObject* self, int i, PyObject* obj, PyObject** holder, Py_buffer* view) {
  const char* name;
  size_t len;
  int rank;
  uint32_t dims[4];
  ekrt_io_info(self->model, 0, i, &name, &len, &rank, dims);
  *holder = NULL;
  memset(view, 0, sizeof *view); /* a failed GetBuffer leaves it as it was: never release garbage */
  if (PyObject_GetBuffer(obj, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0 ||
      !(view->format && strcmp(view->format, "f") == 0 && view->itemsize == 4)) {
    if (view->obj) PyBuffer_Release(view);
    memset(view, 0, sizeof *view);
    PyErr_Clear();
    PyObject* np = numpy_module();
    if (!np) return -1;
    *holder = PyObject_CallMethod(np, "ascontiguousarray", "Os", obj, "float32");
    if (!*holder) return -1;
    if (PyObject_GetBuffer(*holder, view, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) {
      Py_CLEAR(*holder);
      return -1;
    }
  }
  int ok = view->ndim == rank;
  for (int d = 0; ok && d < rank; d++) ok = view->shape[d] == (Py_ssize_t)dims[d];
  if (!ok) {
    PyObject* want = shape_tuple(rank, dims);
    PyObject* got = PyTuple_New(view->ndim);
    for (int d = 0; got && d < view->ndim; d++) PyTuple_SET_ITEM(got, d, PyLong_FromSsize_t(view->shape[d]));
    PyErr_Format(PyExc_ValueError, "input '%s' has shape %R, the model wants %R", name, got, want);
    Py_XDECREF(want);
    Py_XDECREF(got);
    PyBuffer_Release(view);
    Py_CLEAR(*holder);
    return -1;
  }
  return 0;
}

static PyObject* run_locked(ModelObject* self, PyObject* arg) {
  int n_in = ekrt_num_inputs(self->model), n_out = ekrt_num_outputs(self->model);
  PyObject* items[64];
  if (PyDict_Check(arg)) {
    for (int i = 0; i < n_in; i++) {
      const char* name;
      size_t len;
      ekrt_io_info(self->model, 0, i, &name, &len, NULL, NULL);
      PyObject* key = PyUnicode_FromStringAndSize(name, (Py_ssize_t)len);
      if (!key) return NULL;
      items[i] = PyDict_GetItemWithError(arg, key);
      Py_DECREF(key);
      if (!items[i]) {
        if (!PyErr_Occurred()) PyErr_Format(PyExc_KeyError, "no array for input '%s'", name);
        return NULL;
      }
    }
  } else {
    /* A list or tuple holds its items, which stay alive below; any other sequence (a bare numpy
       array) would be turned into a new list of temporary rows, freed before they are read. */
    if (!PyList_Check(arg) && !PyTuple_Check(arg)) {
      PyErr_Format(PyExc_TypeError, "run() takes a list of arrays (one per input) or a dict by input name, not %s",
                   Py_TYPE(arg)->tp_name);
      return NULL;
    }
    PyObject* seq = PySequence_Fast(arg, "run() takes a list of arrays (one per input) or a dict by input name");
    if (!seq) return NULL;
    if (PySequence_Fast_GET_SIZE(seq) != n_in) {
      PyErr_Format(PyExc_ValueError, "run() got %zd arrays, the model has %d inputs", PySequence_Fast_GET_SIZE(seq), n_in);
      Py_DECREF(seq);
      return NULL;
    }
    for (int i = 0; i < n_in; i++) items[i] = PySequence_Fast_GET_ITEM(seq, i);
    Py_DECREF(seq); /* items stay alive: arg holds them */
  }
  Py_buffer in_views[64], out_views[64];
  memset(in_views, 0, sizeof in_views);
  memset(out_views, 0, sizeof out_views);
  PyObject* holders[64] = {NULL};
  const float* inputs[64];
  float* outputs[64];
  int got_in = 0, got_out = 0;
  PyObject* result = PyList_New(n_out);
  PyObject* np = numpy_module();
  if (!result || !np) goto fail;
  for (; got_in < n_in; got_in++) {
    if (get_input(self, got_in, items[got_in], &holders[got_in], &in_views[got_in])) goto fail;
    inputs[got_in] = in_views[got_in].buf;
  }
  for (; got_out < n_out; got_out++) {
    int rank;
    uint32_t dims[4];
    ekrt_io_info(self->model, 1, got_out, NULL, NULL, &rank, dims);
    PyObject* arr = PyObject_CallMethod(np, "empty", "Ns", shape_tuple(rank, dims), "float32");
    if (!arr) goto fail;
    PyList_SET_ITEM(result, got_out, arr);
    if (PyObject_GetBuffer(arr, &out_views[got_out], PyBUF_C_CONTIGUOUS | PyBUF_WRITABLE) != 0) goto fail;
    outputs[got_out] = out_views[got_out].buf;
  }
  int rc;
  Py_BEGIN_ALLOW_THREADS;
  rc = ekrt_run(self->model, inputs, outputs);
  Py_END_ALLOW_THREADS;
  if (rc) {
    PyErr_Format(PyExc_RuntimeError, "ekrt_run failed (code %d)", rc);
    goto fail;
  }
  for (int i = 0; i < got_in; i++) {
    PyBuffer_Release(&in_views[i]);
    Py_XDECREF(holders[i]);
  }
  for (int i = 0; i < got_out; i++) PyBuffer_Release(&out_views[i]);
  return result;
fail:
  for (int i = 0; i < got_in; i++) {
    PyBuffer_Release(&in_views[i]);
    Py_XDECREF(holders[i]);
  }
  for (int i = 0; i < got_out; i++) PyBuffer_Release(&out_views[i]);
  Py_XDECREF(result);
  return NULL;
}

static PyObject* Model_run(ModelObject* self, PyObject* arg) {
  if (check_idle(self)) return NULL;
  /* busy from here: converting the inputs runs Python code, which may let another thread in */
  self->busy = 1;
  PyObject* result = run_locked(self, arg);
  self->busy = 0;
  return result;
}

static PyObject* Model_set_threads(ModelObject* self, PyObject* arg) {
  long n = arg == Py_None ? EKRT_THREADS_AUTO : PyLong_AsLong(arg);
  if (n == -1 && PyErr_Occurred()) return NULL;
  if (check_idle(self)) return NULL;
  int rc = arg != Py_None && (n < 1 || n > 256) ? EKRT_EARG : ekrt_set_threads(self->model, (int)n);
  if (rc == EKRT_EARG) {
    PyErr_Format(PyExc_ValueError, "threads must be 1..256, not %ld", n);
    return NULL;
  }
  if (rc) {
    PyErr_Format(PyExc_RuntimeError, "cannot start %ld threads (code %d)", n, rc);
    return NULL;
  }
  Py_RETURN_NONE;
}

static PyObject* Model_profile(ModelObject* self, PyObject* args) {
  int enable = 1;
  if (!PyArg_ParseTuple(args, "|p", &enable)) return NULL;
  if (check_idle(self)) return NULL;
  ekrt_profile(self->model, enable);
  Py_RETURN_NONE;
}

static PyObject* Model_op_times(ModelObject* self, PyObject* Py_UNUSED(unused)) {
  if (check_idle(self)) return NULL;
  int n = ekrt_num_ops(self->model);
  PyObject* list = PyList_New(n);
  if (!list) return NULL;
  for (int j = 0; j < n; j++) {
    const char* name;
    uint64_t ns;
    ekrt_op_times(self->model, j, &name, &ns);
    PyList_SET_ITEM(list, j, Py_BuildValue("(sK)", name, (unsigned long long)ns));
  }
  return list;
}

static PyObject* Model_partition(ModelObject* self, PyObject* args) {
  int threads, op = -1;
  if (!PyArg_ParseTuple(args, "i|i", &threads, &op)) return NULL;
  if (check_idle(self)) return NULL;
  if (threads < 1 || threads > 256) {
    PyErr_Format(PyExc_ValueError, "threads must be 1..256, not %d", threads);
    return NULL;
  }
  uint64_t macs[256];
  if (ekrt_partition(self->model, threads, op, macs)) {
    PyErr_Format(PyExc_IndexError, "op %d out of range (-1 for the whole model, or 0..%d)", op,
                 ekrt_num_ops(self->model) - 1);
    return NULL;
  }
  PyObject* list = PyList_New(threads);
  if (!list) return NULL;
  for (int t = 0; t < threads; t++) PyList_SET_ITEM(list, t, PyLong_FromUnsignedLongLong(macs[t]));
  return list;
}

static PyMethodDef Model_methods[] = {
    {"run", (PyCFunction)Model_run, METH_O, "run(inputs) -> list of float32 arrays; inputs: list or {name: array}"},
    {"set_threads", (PyCFunction)Model_set_threads, METH_O, "set_threads(n): threads for run(), the caller included; None: one per usable CPU when an op is big enough to split (results do not change)"},
    {"profile", (PyCFunction)Model_profile, METH_VARARGS, "profile(enable=True): per-op timing on/off (resets totals)"},
    {"op_times", (PyCFunction)Model_op_times, METH_NOARGS, "op_times() -> [(op type, total ns), ...] in execution order"},
    {"partition", (PyCFunction)Model_partition, METH_VARARGS, "partition(threads, op=-1) -> conv/FC MACs per thread as run() splits them at that count (op -1: the whole model)"},
    {NULL, NULL, 0, NULL}};

static PyGetSetDef Model_getset[] = {
    {"inputs", (getter)Model_get_inputs, NULL, "[(name, shape), ...]", NULL},
    {"outputs", (getter)Model_get_outputs, NULL, "[(name, shape), ...]", NULL},
    {"threads", (getter)Model_get_threads, NULL, "threads used by run()", NULL},
    {"memory_bytes", (getter)Model_get_memory, NULL, "arena + packed weights + scratch", NULL},
    {NULL, NULL, NULL, NULL, NULL}};

static PyTypeObject ModelType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "edgekit._ekrt.Model",
    .tp_basicsize = sizeof(ModelObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "An ekrt model loaded from .ekm bytes or a path.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Model_init,
    .tp_dealloc = (destructor)Model_dealloc,
    .tp_methods = Model_methods,
    .tp_getset = Model_getset,
};

static PyObject* mod_isa(PyObject* Py_UNUSED(self), PyObject* Py_UNUSED(unused)) {
  return PyUnicode_FromString(ekrt_isa_name());
}

static PyObject* mod_features(PyObject* Py_UNUSED(self), PyObject* Py_UNUSED(unused)) {
  uint64_t f = ekrt_cpu_features();
  PyObject* list = PyList_New(0);
  for (int i = 0; list && i < EK_CPU_N_FEATURES; i++)
    if (f & ek_cpu_feature_bit(i)) {
      PyObject* s = PyUnicode_FromString(ek_cpu_feature_name(ek_cpu_feature_bit(i)));
      if (!s || PyList_Append(list, s)) Py_CLEAR(list);
      Py_XDECREF(s);
    }
  return list;
}

static PyObject* mod_built_isas(PyObject* Py_UNUSED(self), PyObject* Py_UNUSED(unused)) {
  return PyUnicode_FromString(ekrt_built_isas());
}

static PyObject* mod_kernels(PyObject* Py_UNUSED(self), PyObject* Py_UNUSED(unused)) {
  PyObject* d = PyDict_New();
  for (int i = 0; d && i < ekrt_num_kernel_families(); i++) {
    const char *fam, *name;
    ekrt_kernel_choice(i, &fam, &name);
    PyObject* v = PyUnicode_FromString(name);
    PyDict_SetItemString(d, fam, v);
    Py_XDECREF(v);
  }
  return d;
}

static PyObject* mod_quantize_multiplier(PyObject* Py_UNUSED(self), PyObject* arg) {
  double real = PyFloat_AsDouble(arg);
  if (real == -1.0 && PyErr_Occurred()) return NULL;
  int32_t m, s;
  if (ek_quantize_multiplier(real, &m, &s) != 0) {
    PyErr_Format(PyExc_ValueError, "no (multiplier, shift) for %R", arg);
    return NULL;
  }
  return Py_BuildValue("(ii)", (int)m, (int)s);
}

static PyObject* mod_requant(PyObject* Py_UNUSED(self), PyObject* args) {
  int acc, m, s, zp, qmin, qmax;
  if (!PyArg_ParseTuple(args, "iiiiii", &acc, &m, &s, &zp, &qmin, &qmax)) return NULL;
  if (s < EK_SHIFT_MIN || s > EK_SHIFT_MAX || qmin > qmax || qmin < -128 || qmax > 127 || m < 0) {
    PyErr_SetString(PyExc_ValueError, "shift must be -31..30, multiplier >= 0, -128 <= qmin <= qmax <= 127");
    return NULL;
  }
  return PyLong_FromLong(ek_requant(acc, m, s, zp, qmin, qmax));
}

/* counts[bin] += 1 for each float32 v (|v| when absolute), bin = trunc((v - lo) * scale) clipped
 * to 0..bins-1, in float32 arithmetic: numpy's ((v - f32(lo)) * f32(scale)).astype(intp) then
 * clip, bit for bit (NaN goes to bin 0 as there; +inf to the last bin). One pass instead of
 * numpy's four (subtract/multiply, float->int, clip, bincount); four count tables so that a run
 * of equal values (the zeros after a Relu) does not wait on one counter. */
static inline uint32_t hist_bin(float val, int absolute, float lo, float scale, float bins, float top) {
  float t = ((absolute ? fabsf(val) : val) - lo) * scale;
  /* in range: one predictable branch (a min/max pair would be a 50 % guess on ReLU outputs) */
  if (!(t >= 0.0f && t < bins)) t = t >= bins ? top : 0.0f; /* NaN: bin 0 */
  return (uint32_t)t;
}

static PyObject* mod_histogram_add(PyObject* Py_UNUSED(self), PyObject* args) {
  PyObject *values_obj, *counts_obj;
  double lo_d, scale_d;
  int absolute;
  if (!PyArg_ParseTuple(args, "OddOp", &values_obj, &lo_d, &scale_d, &counts_obj, &absolute)) return NULL;
  Py_buffer v, c;
  if (PyObject_GetBuffer(values_obj, &v, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT) != 0) return NULL;
  if (!(v.format && strcmp(v.format, "f") == 0 && v.itemsize == 4)) {
    PyBuffer_Release(&v);
    PyErr_SetString(PyExc_TypeError, "values must be a C-contiguous float32 buffer");
    return NULL;
  }
  if (PyObject_GetBuffer(counts_obj, &c, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT | PyBUF_WRITABLE) != 0) {
    PyBuffer_Release(&v);
    return NULL;
  }
  Py_ssize_t bins = c.itemsize ? c.len / c.itemsize : 0;
  if (!(c.format && strcmp(c.format, "d") == 0 && c.itemsize == 8) || bins < 1 || bins > (1 << 20)) {
    PyBuffer_Release(&v);
    PyBuffer_Release(&c);
    PyErr_SetString(PyExc_TypeError, "counts must be a writable C-contiguous float64 buffer of 1..2^20 bins");
    return NULL;
  }
  if ((unsigned long long)(v.len / 4) > 0xffffffffULL) {
    PyBuffer_Release(&v);
    PyBuffer_Release(&c);
    PyErr_SetString(PyExc_ValueError, "at most 2^32 - 1 values per call");
    return NULL;
  }
  uint32_t* tables = calloc((size_t)bins * 4, sizeof *tables);
  if (!tables) {
    PyBuffer_Release(&v);
    PyBuffer_Release(&c);
    return PyErr_NoMemory();
  }
  const float* x = v.buf;
  size_t n = (size_t)(v.len / 4);
  double* counts = c.buf;
  const float lo = (float)lo_d, scale = (float)scale_d, fbins = (float)bins, top = (float)(bins - 1);
  const size_t stride = (size_t)bins;
  Py_BEGIN_ALLOW_THREADS;
  size_t i = 0;
  for (; i + 4 <= n; i += 4) {
    tables[hist_bin(x[i], absolute, lo, scale, fbins, top)]++;
    tables[stride + hist_bin(x[i + 1], absolute, lo, scale, fbins, top)]++;
    tables[2 * stride + hist_bin(x[i + 2], absolute, lo, scale, fbins, top)]++;
    tables[3 * stride + hist_bin(x[i + 3], absolute, lo, scale, fbins, top)]++;
  }
  for (; i < n; i++) tables[hist_bin(x[i], absolute, lo, scale, fbins, top)]++;
  for (Py_ssize_t b = 0; b < bins; b++)
    counts[b] += (double)tables[b] + (double)tables[bins + b] + (double)tables[2 * bins + b] + (double)tables[3 * bins + b];
  Py_END_ALLOW_THREADS;
  free(tables);
  PyBuffer_Release(&v);
  PyBuffer_Release(&c);
  Py_RETURN_NONE;
}

static PyMethodDef module_methods[] = {
    {"isa", mod_isa, METH_NOARGS, "isa() -> the ISA of the kernels that run (scalar, neon, neondot, avx2, avx512vnni)"},
    {"features", mod_features, METH_NOARGS, "features() -> the CPU's SIMD features ekrt can use"},
    {"built_isas", mod_built_isas, METH_NOARGS, "built_isas() -> 'scalar,avx2,...': the ISAs compiled in"},
    {"kernels", mod_kernels, METH_NOARGS, "kernels() -> {family: chosen kernel}"},
    {"quantize_multiplier", mod_quantize_multiplier, METH_O, "quantize_multiplier(real) -> (multiplier, shift), requant.h"},
    {"requant", mod_requant, METH_VARARGS, "requant(acc, multiplier, shift, zp, qmin, qmax) -> int, requant.h"},
    {"histogram_add", mod_histogram_add, METH_VARARGS,
     "histogram_add(values_f32, lo, scale, counts_f64, absolute): counts[clip(trunc((v - lo) * scale))] += 1, float32 math"},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef moduledef = {PyModuleDef_HEAD_INIT, "edgekit._ekrt", "ekrt, edgekit's int8 runtime (C).", -1,
                                       module_methods, NULL, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__ekrt(void) {
  if (PyType_Ready(&ModelType) < 0) return NULL;
  PyObject* m = PyModule_Create(&moduledef);
  if (!m) return NULL;
  FormatError = PyErr_NewExceptionWithDoc("edgekit._ekrt.FormatError", "The bytes are not a valid .ekm file.",
                                          PyExc_ValueError, NULL);
  Py_INCREF(&ModelType);
  if (!FormatError || PyModule_AddObject(m, "Model", (PyObject*)&ModelType) < 0 ||
      PyModule_AddObject(m, "FormatError", FormatError) < 0 ||
      PyModule_AddStringConstant(m, "version", EKRT_VERSION_STRING) < 0) {
    Py_DECREF(m);
    return NULL;
  }
  return m;
}
