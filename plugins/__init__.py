"""TensorRT face of the dasc state codec: the store / load / merge ops as TensorRT networks of native layers.

    graph.py        a small op graph that describes a network (what both backends read)
    codec.py        the codec's graphs, parameterised by one rank's StateLayout (index tables as constants)
    numpy_eval.py   evaluates a graph with numpy (how the graphs are tested here: nothing can run an engine)
    trt_network.py  a graph as a TensorRT network (tensorrt or tensorrt_rtx) and its serialized engine
    engines.py      `dasc-build --tensorrt`: the arm's codec engines written into the engine directory
"""
