-- KEYS[1]: a requests-per-minute check's GCRA state (the TAT that admit.lua's 'rate' check reads and sets).
-- ARGV: interval_us, tokens wanted, window_us (after prelude.lua: now_us).
-- Grants up to the tokens wanted, each advancing the TAT by one interval, while the TAT stays within window_us of
-- now: Redis never hands out more than the rate plus one window's worth, whichever replicas lease.
-- Returns {granted, 0}, or {0, wait_us} when not one token fits.
local now = now_us()
local interval, wanted, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tat = math.max(tonumber(redis.call('GET', KEYS[1]) or '0'), now)
local room = math.floor((now + window - tat) / interval)
if room < 1 then return {0, tat + interval - window - now} end
local granted = math.min(wanted, room)
local ends = tat + granted * interval
redis.call('SET', KEYS[1], string.format('%d', ends), 'PX', math.ceil((ends - now) / 1000) + 1000)
return {granted, 0}
