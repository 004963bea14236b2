"""rfrs_ref.aggregate"""
