// A Prometheus metric family registered in one call from its name and help text: the services'
// metrics (extractor, scorer, checkpoint watch) declare each family as one line of what it is.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <string>

namespace specwire {

inline prometheus::Family<prometheus::Counter>& CounterFamily(prometheus::Registry& registry,
                                                              const std::string& name,
                                                              const std::string& help) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry);
}

inline prometheus::Family<prometheus::Gauge>& GaugeFamily(prometheus::Registry& registry,
                                                          const std::string& name,
                                                          const std::string& help) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry);
}

inline prometheus::Family<prometheus::Histogram>& HistogramFamily(prometheus::Registry& registry,
                                                                  const std::string& name,
                                                                  const std::string& help) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry);
}

}  // namespace specwire
