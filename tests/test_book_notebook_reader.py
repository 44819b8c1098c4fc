"""The book's notebook reader shows progress bars as Jupyter does: once, in their final state."""

from __future__ import annotations

import nbformat

from servelab_book.notebook_reader import merge_streams, read_notebook, settle_carriage_returns


def stream(name, text):
    return nbformat.v4.new_output("stream", name=name, text=text)


def test_carriage_returns_keep_the_last_write_of_each_line():
    assert settle_carriage_returns("\rbar 0%\rbar 50%\rbar 100%\nnext\r\nend") == "bar 100%\nnext\nend"
    assert settle_carriage_returns("plain\ntext\n") == "plain\ntext\n"


def test_tqdm_refreshes_collapse_and_order_is_kept():
    outs = (
        [stream("stdout", "loading model\n")]
        + [stream("stderr", f"\rsweep: {i}/3") for i in range(4)]
        + [
            stream("stderr", "\n"),
            nbformat.v4.new_output("display_data", data={"text/plain": "table"}),
            stream("stderr", "\rsweep: 0/2"),
            stream("stderr", "\rsweep: 2/2\n"),
            stream("stdout", "done\n"),
        ]
    )
    merged = merge_streams(outs)
    assert [(o.output_type, o.get("name"), o.get("text")) for o in merged] == [
        ("stream", "stdout", "loading model\n"),
        ("stream", "stderr", "sweep: 3/3\n"),
        ("display_data", None, None),
        ("stream", "stderr", "sweep: 2/2\n"),
        ("stream", "stdout", "done\n"),
    ]


def test_read_notebook_touches_only_stream_outputs():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_markdown_cell("# T\n\r"),
        nbformat.v4.new_code_cell("x", outputs=[stream("stderr", "\ra"), stream("stderr", "\rb")]),
    ]
    out = read_notebook(nbformat.writes(nb))
    assert out.cells[0].source == "# T\n\r"
    assert [o.text for o in out.cells[1].outputs] == ["b"]


def test_a_takeaway_echo_is_dropped_but_other_results_stay():
    box = ":::{admonition} F5.1\n:class: tip\nIt's **2×** faster.\n:::\n"
    outs = [
        nbformat.v4.new_output("display_data", data={"text/markdown": box, "text/plain": "<Markdown>"}),
        nbformat.v4.new_output("execute_result", data={"text/plain": repr(box)}, execution_count=3),
        # IPython's pretty printer may wrap a long string as implicitly joined pieces
        nbformat.v4.new_output(
            "execute_result",
            data={
                "text/plain": "(':::{admonition} F5.1\\n'\n ':class: tip\\n'\n \"It's **2×** faster.\\n\"\n ':::\\n')"
            },
            execution_count=3,
        ),
    ]
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("takeaway(...)", outputs=outs),
        nbformat.v4.new_code_cell(
            "'x'", outputs=[nbformat.v4.new_output("execute_result", data={"text/plain": "'x'"}, execution_count=4)]
        ),
    ]
    out = read_notebook(nbformat.writes(nb))
    assert [o.output_type for o in out.cells[0].outputs] == ["display_data"]
    assert [o.output_type for o in out.cells[1].outputs] == ["execute_result"]


def test_papermills_injected_parameters_cell_is_removed_and_the_parameters_cell_kept():
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell('profile = "auto"', metadata={"tags": ["parameters"]}),
        nbformat.v4.new_code_cell('profile = "full"', metadata={"tags": ["injected-parameters"]}),
        nbformat.v4.new_code_cell("run()"),
    ]
    text = nbformat.writes(nb)
    out = read_notebook(text)
    assert [c.metadata.get("tags", []) for c in out.cells] == [
        ["parameters"],
        ["injected-parameters", "remove-cell"],
        [],
    ]
    assert nbformat.writes(nb) == text  # the notebook it was given is untouched
