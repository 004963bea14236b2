"""rfrs_ref.experiments"""
