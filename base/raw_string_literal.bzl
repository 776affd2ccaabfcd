"""A text file compiled into a C++ source, for a built-in configuration (wrap's rules, plan's
GPU targets) that a binary must carry without reading a file at run time."""

def raw_string_literal(name, src, out):
    """`out` holds `src`'s text as a C++ raw string literal, R"textproto(...)textproto", for a
    .cc to #include where it defines a constant; `src` must not contain `)textproto"`."""
    native.genrule(
        name = name,
        srcs = [src],
        outs = [out],
        cmd = "(echo 'R\"textproto('; cat $<; echo ')textproto\"') > $@",
    )
