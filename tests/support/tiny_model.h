// The tiny model of the tests (tests/support/tiny_model.yaml), for tests that
// embed it in a job spec:
//
//   "model:\n  config: " + TinyModelFlowMap() + "\n"
//
// A missing or unreadable file records a GoogleTest failure and yields "{}"
// (which the job spec then rejects). Header-only (yaml-cpp, GoogleTest).
#pragma once

#include <string>

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

namespace tandem::testing {

inline std::string TinyModelPath() { return TANDEM_TEST_SUPPORT_DIR "/tiny_model.yaml"; }

// The model config as one YAML flow map: {vocab_size: 99, hidden_size: 32, ...}.
inline std::string TinyModelFlowMap() {
  try {
    YAML::Node model = YAML::LoadFile(TinyModelPath());
    model.SetStyle(YAML::EmitterStyle::Flow);
    YAML::Emitter out;
    out << model;
    return out.c_str();
  } catch (const YAML::Exception& e) {
    ADD_FAILURE() << TinyModelPath() << ": " << e.what();
    return "{}";
  }
}

}  // namespace tandem::testing
