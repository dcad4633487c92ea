# `pip install .` (pyproject.toml, scikit-build-core): cuda-ckpt and the shim inside the Python package, in
# the layout an installed cuda-ckpt expects (the shim in ../lib next to it; tools/src/run_command.cpp).
install(TARGETS cuda-ckpt RUNTIME DESTINATION vmmckpt/bin)
install(TARGETS vmmckpt LIBRARY DESTINATION vmmckpt/lib)
install(FILES ${PROJECT_SOURCE_DIR}/shim/include/vmmckpt/vmmckpt.h DESTINATION vmmckpt/include/vmmckpt)
