// TorchState: a libtorch model and optimizer in chorus's elastic loop.
#include <sstream>

#include "chorus/torch.h"

namespace chorus::torch_api {

namespace {
std::string serialize(torch::optim::Optimizer& opt) {
  torch::serialize::OutputArchive archive;
  opt.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void deserialize(torch::optim::Optimizer& opt, const std::string& bytes) {
  torch::serialize::InputArchive archive;
  std::istringstream in(bytes);
  archive.load_from(in);
  opt.load(archive);
}
}  // namespace

TorchState::TorchState(std::shared_ptr<torch::nn::Module> model, std::shared_ptr<torch::optim::Optimizer> optimizer)
    : elastic::State(defaultRuntime()), model_(std::move(model)), optimizer_(std::move(optimizer)) {
  save();
}

std::vector<std::pair<std::string, torch::Tensor>> TorchState::tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model_->named_parameters()) out.emplace_back(p.key(), p.value());
  for (const auto& b : model_->named_buffers()) out.emplace_back("buffer." + b.key(), b.value());
  return out;
}

void TorchState::save() {
  torch::NoGradGuard noGrad;
  saved_.clear();
  for (const auto& [name, t] : tensors()) saved_.push_back(t.detach().clone());
  if (optimizer_) savedOptimizer_ = serialize(*optimizer_);
  savedEpoch_ = epoch;
  savedBatch_ = batch;
}

void TorchState::restore() {
  torch::NoGradGuard noGrad;
  const auto now = tensors();
  for (size_t i = 0; i < now.size() && i < saved_.size(); ++i) now[i].second.copy_(saved_[i]);
  if (optimizer_ && !savedOptimizer_.empty()) deserialize(*optimizer_, savedOptimizer_);
  epoch = savedEpoch_;
  batch = savedBatch_;
}

void TorchState::sync() {
  broadcastParameters(tensors(), 0);
  // The optimizer's state and the counters travel as bytes: their length first.
  std::string bytes = optimizer_ ? serialize(*optimizer_) : std::string();
  int64_t head[3] = {static_cast<int64_t>(bytes.size()), epoch, batch};
  OpOptions o;
  o.name = "elastic.state.head";
  rt_.broadcast(Tensor{head, DataType::kInt64, {3}}, 0, o);
  bytes.resize(static_cast<size_t>(head[0]));
  o.name = "elastic.state.optimizer";
  if (head[0] > 0) rt_.broadcast(Tensor{bytes.data(), DataType::kUInt8, {head[0]}}, 0, o);
  if (optimizer_ && head[0] > 0) deserialize(*optimizer_, bytes);
  epoch = head[1];
  batch = head[2];
  save();
}

}  // namespace chorus::torch_api
