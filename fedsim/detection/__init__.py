"""Detection helpers behind small functions that raise on bad input: box fusion (ensemble-boxes) and COCO mAP (pycocotools)."""
from fedsim.detection.fusion import METHODS as FUSION_METHODS, as_detections, fuse
from fedsim.detection.metrics import MatchRecords, accumulate, coco_map, comprehensive, match_records

__all__ = ["FUSION_METHODS", "MatchRecords", "accumulate", "as_detections", "coco_map", "comprehensive", "fuse", "match_records"]
