"""An out-of-tree model: ``ToyForCausalLM``, served for model directories whose config.json says
``"architectures": ["ToyForCausalLM"]`` (``"model_type": "toy"``).

The plugin's callback registers the package of its model modules with SGLang's
``ModelRegistry``; each module there names its classes in ``EntryClass``. The callback runs in
every process of a launch, the launcher's included, so this module imports neither torch nor
the model: the registry records the package and imports it in the scheduler, which loads the
model. ``python -m toy_model.build DIR --tokenizer-from PATH`` writes a small toy model with
random weights to try it.
"""


def register():
    from sglang.srt.models.registry import ModelRegistry

    ModelRegistry.register("toy_model.models")
