"""The real-model suite's registry, builders and data (the parity tests train them; these check their shape)."""

import numpy as np
import pytest

from tfaccel.errors import ConfigError
from tfaccel.real_suite import REAL_MODEL_NAMES, SIZES, get_real_model


def test_unknown_names_and_sizes_are_errors_that_list_the_valid_ones() -> None:
    with pytest.raises(ConfigError, match=r"real model: unknown value 'bert'; valid values are: 'bert_classifier'"):
        get_real_model("bert")
    with pytest.raises(ConfigError, match=r"size: unknown value 'huge'; valid values are: 'test', 'bench'"):
        get_real_model("recommender").job("huge")


@pytest.mark.parametrize("name", REAL_MODEL_NAMES)
def test_every_size_has_data_the_model_takes(name: str) -> None:
    spec = get_real_model(name)
    for size in SIZES:
        x, y = spec.data(size, num_examples=5)
        firsts = list(x.values()) if isinstance(x, dict) else [x]
        assert all(len(a) == 5 for a in firsts + [y]), (name, size)
        again, _ = spec.data(size, num_examples=5)
        assert all(np.array_equal(a, b) for a, b in zip(firsts, list(again.values()) if isinstance(again, dict)
                                                       else [again])), "the data is seeded"


def test_recommender_has_a_100k_row_table_and_its_regulariser_can_be_dropped() -> None:
    spec = get_real_model("recommender")
    model = spec.build("test")
    table = model.get_layer("user_embedding").embeddings
    assert table.shape[0] >= 100_000
    assert model.get_layer("top_hidden").kernel_regularizer is not None
    assert spec.build("test", l2=0.0).get_layer("top_hidden").kernel_regularizer is None
    assert float(model.optimizer.learning_rate) == pytest.approx(spec.learning_rate)
