// The eager path from torch tensors to kernel launches, in C++: a launch program per method and
// signature (recorded once by Python), run with outputs from torch's caching allocator on torch's
// current stream, and a custom autograd node whose backward is the operator's Python formula.
// Python makes each program (shape checks, launch parameters); this file only replays it, so the
// per-call host cost is a signature key, the allocations and the launches. Both entry points are
// plain CPython fast calls (no pybind argument conversion): they are the eager path's hot loop.
#include <torch/extension.h>

#include <torch/csrc/Exceptions.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cuda.h>
#include <dlfcn.h>
#ifdef PYCUDA_HEADS_TORCH_CUDA
#include <ATen/cuda/EmptyTensor.h>
#include <c10/cuda/CUDAStream.h>
#endif

#include <array>
#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

namespace py = pybind11;
using torch::autograd::Node;
using torch::autograd::variable_list;

namespace {

// ---- the driver, opened at run time: nothing to link, so the module loads on any machine ----
struct Driver {
  decltype(&cuLaunchKernelEx) launch = nullptr;
  decltype(&cuCtxGetCurrent) get_current = nullptr;
  decltype(&cuCtxSetCurrent) set_current = nullptr;
  decltype(&cuDevicePrimaryCtxRetain) retain = nullptr;
  decltype(&cuDeviceGet) device_get = nullptr;
  decltype(&cuGetErrorName) error_name = nullptr;
};

const Driver& driver() {
  static const Driver d = [] {
    Driver d;
    void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
    TORCH_CHECK(lib != nullptr, "pycuda_heads native: cannot open libcuda.so.1");
    auto get = [lib](const char* name) {
      void* f = dlsym(lib, name);
      TORCH_CHECK(f != nullptr, "pycuda_heads native: libcuda has no ", name);
      return f;
    };
    d.launch = reinterpret_cast<decltype(d.launch)>(get("cuLaunchKernelEx"));
    d.get_current = reinterpret_cast<decltype(d.get_current)>(get("cuCtxGetCurrent"));
    d.set_current = reinterpret_cast<decltype(d.set_current)>(get("cuCtxSetCurrent"));
    d.retain = reinterpret_cast<decltype(d.retain)>(get("cuDevicePrimaryCtxRetain"));
    d.device_get = reinterpret_cast<decltype(d.device_get)>(get("cuDeviceGet"));
    d.error_name = reinterpret_cast<decltype(d.error_name)>(get("cuGetErrorName"));
    return d;
  }();
  return d;
}

void check(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "?";
  driver().error_name(r, &name);
  TORCH_CHECK(false, what, " failed: ", name);
}

// The device's primary context current in this thread (the kernels were loaded in it; a thread
// torch has not initialised, or an autograd worker, may have none current).
void bind_context(int device) {
  thread_local int bound = -1;
  if (bound == device) return;
  CUcontext current = nullptr;
  check(driver().get_current(&current), "cuCtxGetCurrent");
  if (current == nullptr) {
    CUdevice dev;
    CUcontext primary;
    check(driver().device_get(&dev, device), "cuDeviceGet");
    check(driver().retain(&primary, dev), "cuDevicePrimaryCtxRetain");
    check(driver().set_current(primary), "cuCtxSetCurrent");
  }
  bound = device;
}

// ---- programs ----
enum Source { INPUT = 0, OUTPUT = 1, SCRATCH = 2 };

struct Pointer {
  int64_t slot, source, index, offset;
};

struct Launch {
  CUfunction function;
  unsigned grid[3], block[3], shared;
  bool pdl;
  std::string slots;  // 8 bytes an argument, pointers zero
  std::vector<Pointer> pointers;
};

struct Program {
  std::vector<Launch> launches;
  std::vector<std::vector<int64_t>> outputs;  // float32 shapes
  int64_t scratch_bytes = 0;
  int device = 0;
};

// What decides a program: per tensor its shape, dtype, device, contiguity and address modulo 16
// (the ops' alignment checks), or that it is absent.
using Key = std::vector<int64_t>;
struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = k.size();
    for (int64_t v : k) h = h * 1000003u ^ static_cast<size_t>(v);
    return h;
  }
};

Key signature(const std::vector<std::optional<at::Tensor>>& tensors) {
  Key key;
  key.reserve(tensors.size() * 8);
  for (const auto& t : tensors) {
    if (!t.has_value() || !t->defined()) {
      key.push_back(-1);
      continue;
    }
    key.push_back(t->dim());
    for (int64_t s : t->sizes()) key.push_back(s);
    key.push_back(static_cast<int64_t>(t->scalar_type()));
    key.push_back(t->is_cuda() ? t->get_device() : -2);
    key.push_back(t->is_contiguous());
    key.push_back(reinterpret_cast<uintptr_t>(t->data_ptr()) % 16);
  }
  return key;
}

struct Method {
  py::object record;  // tensors -> the program's description (raises on bad input)
  std::unordered_map<Key, std::shared_ptr<const Program>, KeyHash> programs;
};

// Python objects live as long as the process: never destroyed after the interpreter is gone.
std::mutex methods_lock;
auto& methods = *new std::vector<std::unique_ptr<Method>>();

Method& method(int64_t handle) {
  std::lock_guard<std::mutex> guard(methods_lock);
  TORCH_CHECK(handle >= 0 && handle < static_cast<int64_t>(methods.size()),
              "pycuda_heads native: no method ", handle);
  return *methods[handle];
}

std::shared_ptr<const Program> describe(py::handle d) {
  // (launches, outputs, scratch_bytes, device); a launch is (function, grid, block, shared, pdl,
  // slots, pointers)
  auto program = std::make_shared<Program>();
  auto t = d.cast<py::tuple>();
  for (auto l : t[0].cast<py::list>()) {
    auto lt = l.cast<py::tuple>();
    Launch launch;
    launch.function = reinterpret_cast<CUfunction>(lt[0].cast<uintptr_t>());
    auto grid = lt[1].cast<std::array<unsigned, 3>>();
    auto block = lt[2].cast<std::array<unsigned, 3>>();
    std::copy(grid.begin(), grid.end(), launch.grid);
    std::copy(block.begin(), block.end(), launch.block);
    launch.shared = lt[3].cast<unsigned>();
    launch.pdl = lt[4].cast<bool>();
    launch.slots = lt[5].cast<std::string>();
    for (auto p : lt[6].cast<py::list>()) {
      auto pt = p.cast<std::array<int64_t, 4>>();
      launch.pointers.push_back({pt[0], pt[1], pt[2], pt[3]});
    }
    program->launches.push_back(std::move(launch));
  }
  program->outputs = t[1].cast<std::vector<std::vector<int64_t>>>();
  program->scratch_bytes = t[2].cast<int64_t>();
  program->device = t[3].cast<int>();
  return program;
}

std::atomic<int64_t> launch_count{0};  // a host tally for tests, not data on the device

// torch's current stream on the device. A build against a CPU torch (a test's) compiles this
// file but has no CUDA device to launch on: native.py never loads it for launches.
CUstream current_stream(int device) {
#ifdef PYCUDA_HEADS_TORCH_CUDA
  return reinterpret_cast<CUstream>(c10::cuda::getCurrentCUDAStream(device).stream());
#else
  TORCH_CHECK(false, "pycuda_heads native: built against a CPU torch, nothing to launch on ",
              "(device ", device, ")");
#endif
}

// A float32 (or byte) buffer on the device from torch's caching allocator. A CUDA torch's own
// allocation, without at::empty's dispatch: every output is written whole by its kernel.
at::Tensor empty(at::IntArrayRef shape, at::ScalarType dtype, int device) {
#ifdef PYCUDA_HEADS_TORCH_CUDA
  return at::detail::empty_cuda(shape, dtype, at::Device(at::kCUDA, device), std::nullopt);
#else
  return at::empty(shape, at::TensorOptions().dtype(dtype).device(at::kCUDA, device));
#endif
}

std::vector<at::Tensor> run(int64_t handle, const std::vector<std::optional<at::Tensor>>& tensors) {
  Method& m = method(handle);
  Key key;
  bool keyed = true;
  try {
    key = signature(tensors);
  } catch (const c10::Error&) {  // a tensor without storage: the record's checks name it
    keyed = false;
  }
  std::shared_ptr<const Program> program;
  if (keyed) {
    std::lock_guard<std::mutex> guard(methods_lock);
    auto hit = m.programs.find(key);
    if (hit != m.programs.end()) program = hit->second;
  }
  if (!program) {
    py::gil_scoped_acquire gil;
    program = describe(m.record(tensors));
    std::lock_guard<std::mutex> guard(methods_lock);
    if (m.programs.size() >= 1024) m.programs.clear();  // many batch sizes: start afresh
    if (keyed) m.programs.emplace(key, program);
  }
  std::vector<at::Tensor> outputs;
  outputs.reserve(program->outputs.size());
  for (const auto& shape : program->outputs)
    outputs.push_back(empty(shape, at::kFloat, program->device));
  at::Tensor scratch;
  if (program->scratch_bytes) scratch = empty({program->scratch_bytes}, at::kByte, program->device);
  CUstream stream = current_stream(program->device);
  bind_context(program->device);

  std::vector<char> slots;
  std::vector<void*> params;
  for (const Launch& l : program->launches) {
    slots.assign(l.slots.begin(), l.slots.end());
    for (const Pointer& p : l.pointers) {
      uintptr_t base = 0;
      if (p.source == INPUT) base = reinterpret_cast<uintptr_t>(tensors[p.index]->data_ptr());
      else if (p.source == OUTPUT) base = reinterpret_cast<uintptr_t>(outputs[p.index].data_ptr());
      else base = reinterpret_cast<uintptr_t>(scratch.data_ptr());
      uint64_t address = base + p.offset;
      std::memcpy(slots.data() + 8 * p.slot, &address, 8);
    }
    params.resize(slots.size() / 8);
    for (size_t i = 0; i < params.size(); ++i) params[i] = slots.data() + 8 * i;
    CUlaunchConfig config{};
    config.gridDimX = l.grid[0];
    config.gridDimY = l.grid[1];
    config.gridDimZ = l.grid[2];
    config.blockDimX = l.block[0];
    config.blockDimY = l.block[1];
    config.blockDimZ = l.block[2];
    config.sharedMemBytes = l.shared;
    config.hStream = stream;
    CUlaunchAttribute attribute{};
    if (l.pdl) {
      attribute.id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
      attribute.value.programmaticStreamSerializationAllowed = 1;
      config.attrs = &attribute;
      config.numAttrs = 1;
    }
    check(driver().launch(&config, l.function, params.data(), nullptr), "cuLaunchKernelEx");
    ++launch_count;
  }
  return outputs;
}

// ---- autograd: a differentiable operator's node, made as torch's generated ones are (no
// custom-function context); what it saves is declared per rule, its backward is the rule's
// Python formula ----
struct Rule {
  std::string name;
  std::vector<int64_t> save_inputs, save_outputs, non_differentiable;
  py::object backward;  // (op, saved tensors, *grads) -> one gradient (or None) per input
};

auto& rules = *new std::vector<std::unique_ptr<Rule>>();

struct FormulaNode : public Node {
  const Rule* rule = nullptr;
  int64_t op = 0;
  size_t inputs = 0;
  std::vector<torch::autograd::SavedVariable> saved;
  std::mutex lock;

  std::string name() const override { return "pycuda_heads::" + rule->name + "Backward"; }

  variable_list apply(variable_list&& grads) override {
    std::lock_guard<std::mutex> guard(lock);
    variable_list tensors;
    for (const auto& s : saved) tensors.push_back(s.unpack(getptr()));
    py::gil_scoped_acquire gil;
    py::list given;
    for (const auto& g : grads) given.append(g.defined() ? py::cast(g) : py::none());
    py::tuple got = rule->backward(op, tensors, *given);
    TORCH_CHECK(got.size() == inputs, "pycuda_heads native: a backward gave ", got.size(),
                " gradients for ", inputs, " inputs");
    variable_list result;
    for (auto g : got) result.push_back(g.is_none() ? at::Tensor() : g.cast<at::Tensor>());
    return result;
  }

  void release_variables() override {
    // the slots stay: a second backward through the node then gets torch's own error
    std::lock_guard<std::mutex> guard(lock);
    for (auto& s : saved) s.reset_data();
  }
};

// torch holds nodes by std::shared_ptr in older releases and by c10::intrusive_ptr in newer
// ones: make ours the way this torch does
using NodePtr = decltype(std::declval<Node&>().getptr());
template <class P>
struct NodeMaker;
template <>
struct NodeMaker<std::shared_ptr<Node>> {
  template <class N>
  static std::shared_ptr<N> make() { return std::shared_ptr<N>(new N()); }
};
template <>
struct NodeMaker<c10::intrusive_ptr<Node>> {
  template <class N>
  static c10::intrusive_ptr<N> make() { return c10::make_intrusive<N>(); }
};

variable_list apply(int64_t rule, int64_t handle, int64_t op, const std::vector<at::Tensor>& in) {
  auto outputs = run(handle, std::vector<std::optional<at::Tensor>>(in.begin(), in.end()));
  if (!torch::autograd::compute_requires_grad(in)) return outputs;
  const Rule& r = *rules.at(rule);
  auto node = NodeMaker<NodePtr>::make<FormulaNode>();
  node->rule = &r;
  node->op = op;
  node->inputs = in.size();
  node->set_next_edges(torch::autograd::collect_next_edges(in));
  NodePtr as_node = node;
  for (size_t i = 0; i < outputs.size(); ++i) {
    bool differentiable = std::find(r.non_differentiable.begin(), r.non_differentiable.end(),
                                    static_cast<int64_t>(i)) == r.non_differentiable.end();
    if (differentiable)
      torch::autograd::set_history(outputs[i], as_node);
    else
      node->add_input_metadata(Node::undefined_input());
  }
  for (int64_t i : r.save_inputs) node->saved.emplace_back(in[i], false);
  for (int64_t i : r.save_outputs) node->saved.emplace_back(outputs[i], true);
  return outputs;
}

// ---- the entry points: tensors straight from the call's arguments, outputs as a tuple ----
int64_t integer(PyObject* o) {
  int64_t v = PyLong_AsLongLong(o);
  if (v == -1 && PyErr_Occurred()) throw python_error();
  return v;
}

// An argument that is not a tensor: the method's record runs its checks, which name it.
[[noreturn]] void refuse(int64_t handle, PyObject* const* args, Py_ssize_t n, Py_ssize_t at) {
  py::tuple given(n);
  for (Py_ssize_t i = 0; i < n; ++i) given[i] = py::reinterpret_borrow<py::object>(args[i]);
  method(handle).record(given);
  TORCH_CHECK_TYPE(false, "pycuda_heads native: argument ", at, " is not a tensor");
}

PyObject* wrap(std::vector<at::Tensor>&& outputs) {
  PyObject* tuple = PyTuple_New(static_cast<Py_ssize_t>(outputs.size()));
  if (tuple == nullptr) throw python_error();
  for (size_t i = 0; i < outputs.size(); ++i)
    PyTuple_SET_ITEM(tuple, i, THPVariable_Wrap(std::move(outputs[i])));
  return tuple;
}

// run(handle, *tensors): a tensor argument may be None (an optional one absent)
PyObject* run_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(nargs >= 1, "run(handle, *tensors): no handle");
  int64_t handle = integer(args[0]);
  std::vector<std::optional<at::Tensor>> tensors;
  tensors.reserve(nargs - 1);
  for (Py_ssize_t i = 1; i < nargs; ++i) {
    if (args[i] == Py_None) tensors.emplace_back(std::nullopt);
    else if (THPVariable_Check(args[i])) tensors.emplace_back(THPVariable_Unpack(args[i]));
    else refuse(handle, args + 1, nargs - 1, i - 1);
  }
  return wrap(run(handle, tensors));
  END_HANDLE_TH_ERRORS
}

// apply(rule, handle, *tensors, op): every tensor argument given
PyObject* apply_call(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  HANDLE_TH_ERRORS
  TORCH_CHECK_TYPE(nargs >= 3, "apply(rule, handle, *tensors, op): too few arguments");
  int64_t rule = integer(args[0]), handle = integer(args[1]), op = integer(args[nargs - 1]);
  std::vector<at::Tensor> tensors;
  tensors.reserve(nargs - 3);
  for (Py_ssize_t i = 2; i < nargs - 1; ++i) {
    if (!THPVariable_Check(args[i])) refuse(handle, args + 2, nargs - 3, i - 2);
    tensors.push_back(THPVariable_Unpack(args[i]));
  }
  return wrap(apply(rule, handle, op, tensors));
  END_HANDLE_TH_ERRORS
}

PyMethodDef calls[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(run_call)), METH_FASTCALL,
     "run(handle, *tensors): the method's launches for these tensors; a tuple of its outputs."},
    {"apply", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(apply_call)),
     METH_FASTCALL,
     "apply(rule, handle, *tensors, op): ``run``, its outputs joined to the autograd graph by "
     "one node of ``rule``; a tuple."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("method", [](py::object record) {
    std::lock_guard<std::mutex> guard(methods_lock);
    methods.push_back(std::make_unique<Method>(Method{std::move(record), {}}));
    return static_cast<int64_t>(methods.size() - 1);
  }, "A method whose programs ``record(tensors)`` describes; its handle.");
  m.def("rule", [](std::string name, std::vector<int64_t> save_inputs,
                   std::vector<int64_t> save_outputs, std::vector<int64_t> non_differentiable,
                   py::object backward) {
    rules.push_back(std::make_unique<Rule>(Rule{std::move(name), std::move(save_inputs),
                                                std::move(save_outputs),
                                                std::move(non_differentiable),
                                                std::move(backward)}));
    return static_cast<int64_t>(rules.size() - 1);
  }, "A differentiable operator's autograd rule; its id.");
  if (PyModule_AddFunctions(m.ptr(), calls) != 0) throw py::error_already_set();
  m.def("launch_count", [] { return launch_count.load(); }, "Launches made so far.");
}
