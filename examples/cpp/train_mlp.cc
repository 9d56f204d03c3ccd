// Data-parallel training of a small MLP on a synthetic two-spirals problem.
// Each rank trains on its shard; gradients are averaged with one grouped
// allreduce per step; rank 0's initial weights are broadcast to everyone.
//   chorusrun -np 2 ./build/train_mlp
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "chorus/chorus.h"

namespace {

constexpr int kHidden = 32;
constexpr int kSamples = 2048;

struct Sample {
  float x0, x1;
  float label;
};

// Two interleaved spirals: not linearly separable, so the hidden layer matters.
std::vector<Sample> makeData() {
  std::mt19937 gen(1234);
  std::normal_distribution<float> noise(0.0f, 0.05f);
  std::vector<Sample> data;
  for (int i = 0; i < kSamples; ++i) {
    int cls = i % 2;
    float t = 0.25f + 2.5f * static_cast<float>(i / 2) / (kSamples / 2);
    float angle = t * 3.0f + cls * 3.14159265f;
    data.push_back({t * std::cos(angle) + noise(gen), t * std::sin(angle) + noise(gen), static_cast<float>(cls)});
  }
  std::shuffle(data.begin(), data.end(), gen);
  return data;
}

struct Model {
  std::vector<float> w1 = std::vector<float>(2 * kHidden), b1 = std::vector<float>(kHidden);
  std::vector<float> w2 = std::vector<float>(kHidden), b2 = std::vector<float>(1);
  std::vector<std::vector<float>*> params() { return {&w1, &b1, &w2, &b2}; }
};

float sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Forward and backward over a batch; adds gradients into g, returns summed loss.
float lossAndGrad(const Model& m, const Sample* batch, int n, Model& g, int* correct) {
  float total = 0;
  float h[kHidden];
  for (int s = 0; s < n; ++s) {
    const Sample& x = batch[s];
    float z = m.b2[0];
    for (int j = 0; j < kHidden; ++j) {
      h[j] = std::tanh(m.w1[j] * x.x0 + m.w1[kHidden + j] * x.x1 + m.b1[j]);
      z += m.w2[j] * h[j];
    }
    float p = sigmoid(z);
    total += -(x.label * std::log(p + 1e-7f) + (1 - x.label) * std::log(1 - p + 1e-7f));
    *correct += (p > 0.5f) == (x.label > 0.5f);
    float dz = p - x.label;
    g.b2[0] += dz;
    for (int j = 0; j < kHidden; ++j) {
      g.w2[j] += dz * h[j];
      float dh = dz * m.w2[j] * (1 - h[j] * h[j]);
      g.w1[j] += dh * x.x0;
      g.w1[kHidden + j] += dh * x.x1;
      g.b1[j] += dh;
    }
  }
  return total;
}

chorus::Tensor view(std::vector<float>& v) {
  return chorus::Tensor{v.data(), chorus::DataType::kFloat32, {static_cast<int64_t>(v.size())}};
}

}  // namespace

int main() {
  chorus::init();
  chorus::Runtime& rt = chorus::defaultRuntime();
  const int rank = rt.rank(), size = rt.size();

  auto data = makeData();
  std::vector<Sample> shard;  // every size-th sample, starting at this rank
  for (size_t i = rank; i < data.size(); i += size) shard.push_back(data[i]);

  Model model;
  std::mt19937 gen(rank + 1);  // deliberately different per rank...
  std::normal_distribution<float> init(0.0f, 1.0f);
  for (auto* p : model.params())
    for (auto& v : *p) v = init(gen);
  for (auto* p : model.params()) rt.broadcast(view(*p), 0);  // ...until rank 0's weights win

  const int batch = 32, epochs = 30;
  const float lr = 0.1f * size;  // learning rate scaled by the number of ranks
  for (int epoch = 0; epoch < epochs; ++epoch) {
    float epochLoss = 0;
    int correct = 0;
    for (size_t start = 0; start + batch <= shard.size(); start += batch) {
      Model grad;
      epochLoss += lossAndGrad(model, shard.data() + start, batch, grad, &correct);
      std::vector<chorus::Tensor> gs;
      for (auto* p : grad.params()) {
        for (auto& v : *p) v /= batch;
        gs.push_back(view(*p));
      }
      chorus::AllreduceOptions avg;
      avg.op = chorus::ReduceOp::kAverage;
      avg.name = "grads";
      rt.groupedAllreduceAsync(gs, gs, avg).wait();
      auto ps = model.params(), qs = grad.params();
      for (size_t k = 0; k < ps.size(); ++k)
        for (size_t i = 0; i < ps[k]->size(); ++i) (*ps[k])[i] -= lr * (*qs[k])[i];
    }
    // Metrics averaged across ranks.
    float metrics[2] = {epochLoss / shard.size(), static_cast<float>(correct) / shard.size()};
    chorus::AllreduceOptions avg;
    avg.op = chorus::ReduceOp::kAverage;
    avg.name = "metrics";
    rt.allreduce(chorus::Tensor{metrics, chorus::DataType::kFloat32, {2}},
                 chorus::Tensor{metrics, chorus::DataType::kFloat32, {2}}, avg);
    if (rank == 0 && (epoch % 3 == 0 || epoch == epochs - 1))
      std::printf("epoch %2d  loss %.4f  train accuracy %.3f\n", epoch, metrics[0], metrics[1]);
  }
  chorus::shutdown();
  return 0;
}
