#include "proto/convert.h"

namespace specwire {

void ContractToProto(const ExtractionContract& c, v1::ExtractionContract* out) {
  out->set_architecture(c.architecture);
  out->set_model_type(c.model_type);
  out->set_source_layout(c.source_layout);
  out->set_source_architecture(c.source_architecture);
  out->set_weight_prefix(c.weight_prefix);
  out->set_tensors_loaded(c.tensors_loaded);
  out->set_tensors_skipped(c.tensors_skipped);
  for (const auto& s : c.skipped) {
    auto* p = out->add_skipped();
    p->set_prefix(s.prefix);
    p->set_count(s.count);
    p->set_reason(s.reason);
  }
  out->set_num_layers(static_cast<int32_t>(c.num_layers));
  out->set_hidden_size(static_cast<int32_t>(c.hidden_size));
  out->set_vocab_size(static_cast<int32_t>(c.vocab_size));
  for (const auto& t : c.layer_types) out->add_layer_types(t);
  out->set_compute_dtype(c.compute_dtype);
  for (const auto& d : c.devices) out->add_devices(d);
  out->set_kernel_variant(c.kernel_variant);
  out->set_weights_digest(c.weights_digest);
  out->set_tokenizer_digest(c.tokenizer_digest);
  out->set_specwire_version(c.specwire_version);
}

ExtractionContract ContractFromProto(const v1::ExtractionContract& p) {
  ExtractionContract c;
  c.architecture = p.architecture();
  c.model_type = p.model_type();
  c.source_layout = p.source_layout();
  c.source_architecture = p.source_architecture();
  c.weight_prefix = p.weight_prefix();
  c.tensors_loaded = p.tensors_loaded();
  c.tensors_skipped = p.tensors_skipped();
  for (const auto& s : p.skipped()) c.skipped.push_back({s.prefix(), s.count(), s.reason()});
  c.num_layers = p.num_layers();
  c.hidden_size = p.hidden_size();
  c.vocab_size = p.vocab_size();
  c.layer_types.assign(p.layer_types().begin(), p.layer_types().end());
  c.compute_dtype = p.compute_dtype();
  c.devices.assign(p.devices().begin(), p.devices().end());
  c.kernel_variant = p.kernel_variant();
  c.weights_digest = p.weights_digest();
  c.tokenizer_digest = p.tokenizer_digest();
  c.specwire_version = p.specwire_version();
  return c;
}

v1::WireDType WireDTypeToProto(DType d) {
  switch (d) {
    case DType::kBF16:
      return v1::WIRE_DTYPE_BF16;
    case DType::kF32:
      return v1::WIRE_DTYPE_F32;
    case DType::kF16:
      return v1::WIRE_DTYPE_F16;
  }
  return v1::WIRE_DTYPE_UNSPECIFIED;
}

}  // namespace specwire
