"""A small transformer as a user would bring it: the factory that `zbopt profile-model
own_model:small_transformer` and `zbopt run-torch plan.json --model own_model:small_transformer`
call (run them in this folder, or put it on PYTHONPATH). An embedding, encoder layers and a head
over a vocabulary of 512; one microbatch is 4 sequences of 32 tokens. Dropout is 0 so that a
pipelined run's gradients can match one process's exactly."""

import torch

VOCABULARY, WIDTH, HEADS = 512, 64, 4


def small_transformer():
    """Four encoder layers: (layers, one microbatch's token ids, the loss of the head's logits),
    weights from torch's generator, so every process that seeds it builds the same model."""
    return _transformer(4)


def transformer_24():
    """The same with 24 encoder layers (issue 43's target: profile, plan and run in two minutes)."""
    return _transformer(24)


def _transformer(depth: int):
    layers = [torch.nn.Embedding(VOCABULARY, WIDTH)]
    layers += [torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, batch_first=True)
               for _ in range(depth)]
    layers.append(torch.nn.Linear(WIDTH, VOCABULARY))
    tokens = torch.randint(0, VOCABULARY, (4, 32))
    targets = torch.roll(tokens, shifts=-1, dims=1)  # next-token prediction on the sample's own ids

    def loss(logits):
        return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())

    return layers, tokens, loss
