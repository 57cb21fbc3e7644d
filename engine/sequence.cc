#include "engine/sequence.h"

#include <utility>

namespace lair::engine {

Sequence::Sequence(SequenceId id, RequestGroup* group, int index, std::vector<int32_t> tokens,
                   int num_computed_tokens, std::string saved_state)
    : num_computed_tokens(num_computed_tokens),
      saved_state(std::move(saved_state)),
      id_(id),
      group_(group),
      index_(index),
      tokens_(std::move(tokens)),
      num_prompt_tokens_(static_cast<int>(group->request.prompt_tokens.size())),
      sampling_(group->request.sampling, group->request.prompt_tokens, group->seed, index) {
  for (size_t i = num_prompt_tokens_; i < tokens_.size(); ++i) sampling_.Accept(tokens_[i]);
}

void Sequence::AppendToken(int32_t token) {
  tokens_.push_back(token);
  sampling_.Accept(token);
}

}  // namespace lair::engine
