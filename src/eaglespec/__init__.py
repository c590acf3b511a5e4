"""eaglespec: lossless speculative decoding with EAGLE draft heads.

    import eaglespec
    model = eaglespec.load("smollm2-135m-instruct", head="default")
    print(model.generate("Hello!", chat=True).text)
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    if name in ("load", "Model"):  # imported on first use: `eaglespec --help` stays fast
        from eaglespec import api

        return getattr(api, name)
    raise AttributeError(f"module 'eaglespec' has no attribute '{name}'")
