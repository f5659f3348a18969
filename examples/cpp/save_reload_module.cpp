// save_reload_module: saves a small libtorch module with tz-torch, reloads it
// into a freshly initialised one and checks that both are identical.
//
//   save_reload_module [FILE]       (default: net.tensors)
//
// Build against an installed tensorizer with tz-torch (see CMakeLists.txt).
#include <tensorizer/torch.hpp>
#include <torch/nn/functional/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/linear.h>
#include <torch/utils.h>

#include <iostream>
#include <string>

namespace tzt = tensorizer::torch;

struct NetImpl : torch::nn::Module {
  NetImpl()
      : fc1(register_module("fc1", torch::nn::Linear(8, 16))),
        norm(register_module("norm", torch::nn::BatchNorm1d(16))),
        fc2(register_module("fc2", torch::nn::Linear(16, 4))) {
    // A root tensor: stored as ".scale", as Python's write_module names it.
    scale = register_buffer("scale", torch::linspace(0.5, 2.0, 4).to(torch::kBFloat16));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc2(torch::nn::functional::relu(norm(fc1(x)))) * scale.to(torch::kFloat);
  }
  torch::nn::Linear fc1;
  torch::nn::BatchNorm1d norm;
  torch::nn::Linear fc2;
  torch::Tensor scale;
};
TORCH_MODULE(Net);

int main(int argc, char** argv) {
  const std::string path = argc > 1 ? argv[1] : "net.tensors";
  try {
    torch::manual_seed(0);
    Net net;
    net->forward(torch::randn({32, 8}));  // training mode: moves BatchNorm's running statistics
    tzt::save_module(path, net);

    torch::manual_seed(1);
    Net fresh;  // different initial weights
    tzt::LoadOptions options;
    options.verify_hash = true;
    const size_t loaded = tzt::load_into_module(path, fresh, options);

    bool same = true;
    for (const auto& p : net->named_parameters()) same &= torch::equal(p.value(), fresh->named_parameters()[p.key()]);
    for (const auto& b : net->named_buffers()) same &= torch::equal(b.value(), fresh->named_buffers()[b.key()]);
    net->eval();
    fresh->eval();
    const torch::Tensor x = torch::randn({4, 8});
    same &= torch::equal(net->forward(x), fresh->forward(x));
    std::cout << "saved and reloaded " << loaded << " tensors via " << path << ": "
              << (same ? "identical" : "DIFFERENT") << "\n";
    return same ? 0 : 1;
  } catch (const tzt::Error& e) {
    std::cerr << "tensorizer error " << e.code_name() << ": " << e.what() << "\n";
    return 1;
  }
}
