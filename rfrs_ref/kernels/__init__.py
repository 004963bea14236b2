"""rfrs_ref.kernels"""
